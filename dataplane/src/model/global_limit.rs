//! The global rate limit of a route (ingress-nginx's `global-rate-limit*` annotations and
//! `global-rate-limit-memcached-*` keys): counters shared by every replica in memcached.

use serde::{Deserialize, Serialize};

use super::IpNet;

/// A limit per window, counted per key across replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalRateLimit {
    /// Requests per window (`global-rate-limit`).
    pub limit: u64,
    /// The window (`global-rate-limit-window`), in milliseconds.
    pub window_ms: u64,
    /// What is counted (`global-rate-limit-key`, default `$remote_addr`): the variables of
    /// `upstream-hash-by`.
    pub key: String,
    /// Clients never limited (`global-rate-limit-ignored-cidrs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt: Vec<IpNet>,
    /// Whose counters these are (`namespace/ingress`): two Ingresses never share a count.
    pub zone: String,
    /// The status of refused requests (`global-rate-limit-status-code`, default 429).
    pub status: u16,
    /// Where the counters live.
    pub memcached: Memcached,
}

/// A memcached server (`global-rate-limit-memcached-*`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memcached {
    /// Host name or address.
    pub host: String,
    /// Port (default 11211).
    pub port: u16,
    /// Timeout of connecting and of each exchange, in milliseconds (default 50).
    pub connect_timeout_ms: u64,
    /// How long a pooled connection may stay idle, in milliseconds (default 10000).
    pub idle_timeout_ms: u64,
    /// Idle connections kept (default 50).
    pub pool_size: u32,
}
