//! The HTTP proxy: listeners, forwarding, upgrades and the upstream client pool.
