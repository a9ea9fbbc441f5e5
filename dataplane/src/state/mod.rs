//! What survives a table swap: balancers with their per-endpoint state, rate and connection
//! limiters, external authentication's answer caches, response pacing.

pub mod authcache;
pub mod balance;
pub mod connlimit;
pub mod global_limit;
pub mod memcached;
pub mod ratelimit;
pub mod throttle;
