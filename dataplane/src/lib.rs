//! weir's dataplane: the routing-table model, the compiled router, balancers, the HTTP proxy and
//! TLS (termination, SNI certificates, mTLS, passthrough, upstream TLS).
//!
//! It never depends on Kubernetes: its only input is [`model::RouteTable`].

pub mod accesslog;
pub mod auth;
pub mod balance;
pub mod canary;
pub mod cors;
pub mod echo;
pub mod hashkey;
pub mod http_util;
pub mod l4;
pub mod model;
pub mod mtls;
pub mod policy;
pub mod proxy;
pub mod ratelimit;
pub mod realip;
pub mod router;
pub mod tls;
