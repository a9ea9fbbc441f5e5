//! Load balancing over the endpoints of a backend.
