//! weir's controller: sources of Kubernetes objects, their translation into the dataplane's
//! routing table, and the `weir` command line.

pub mod source;
pub mod translate;
