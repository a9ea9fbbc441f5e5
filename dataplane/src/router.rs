//! The compiled router: host → path lookup with Ingress precedence.
