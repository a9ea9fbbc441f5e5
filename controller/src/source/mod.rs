//! Sources of Kubernetes objects: manifest files (the embedded default) and the Kubernetes API.

pub mod files;
pub mod kube;
pub mod manifest;
pub mod trim;
