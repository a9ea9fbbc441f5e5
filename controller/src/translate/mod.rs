//! Translation of a snapshot of Kubernetes objects into the dataplane routing table (pure).
