//! Parsing YAML manifests into typed Kubernetes objects.
