//! Sources of Kubernetes objects: manifest files (the embedded default) and, later, the API server.

pub mod files;
pub mod manifest;
