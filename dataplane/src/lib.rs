//! weir's dataplane: the routing-table model, the compiled router, balancers, the HTTP proxy and
//! TLS (termination, SNI certificates, mTLS, passthrough, upstream TLS).
//!
//! It never depends on Kubernetes: its only input is [`model::RouteTable`].

pub mod accesslog;
pub mod auth;
pub mod authcache;
pub mod balance;
pub mod canary;
pub mod ciphers;
pub mod connlimit;
pub mod cors;
pub mod echo;
/// Hash maps and sets keyed by configuration (host names, paths, names from API objects),
/// hashed with foldhash, seeded per process, instead of SipHash: the keys never come from a
/// request (a request's host and path are only looked up), and SipHash cost three probes per
/// request in the router and ~4 % of a full translation.
pub mod fast {
    /// A `HashMap` with foldhash.
    pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
    /// A `HashSet` with foldhash.
    pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
}
pub mod hashkey;
pub mod http_util;
pub mod l4;
pub mod model;
pub mod mtls;
pub mod policy;
pub mod proxy;
pub mod ratelimit;
pub mod realip;
pub mod rewrite_response;
pub mod router;
pub mod sessions;
pub mod throttle;
pub mod tls;
pub mod uri_path;
