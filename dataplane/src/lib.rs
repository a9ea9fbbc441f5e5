//! weir's dataplane: the routing-table model, the compiled router, balancers, the HTTP proxy and
//! TLS (termination, SNI certificates, mTLS, passthrough, upstream TLS).
//!
//! It never depends on Kubernetes: its only input is [`model::RouteTable`].

pub mod echo;
pub mod fast;
pub mod hashkey;
pub mod http_util;
pub mod model;
pub mod proxy;
pub mod route;
pub mod state;
pub mod tls;
