//! Ingress conformance runner.
