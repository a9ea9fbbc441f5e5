//! `weir echo`: a debugging backend that answers every request with JSON describing it.
