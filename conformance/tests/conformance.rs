//! Conformance scenarios.
