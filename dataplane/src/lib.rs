//! weir's dataplane: the routing-table model, the compiled router, balancers, the HTTP proxy and
//! TLS (termination, SNI certificates, mTLS, passthrough, upstream TLS).
//!
//! It never depends on Kubernetes: its only input is [`model::RouteTable`].
//!
//! # Layers
//!
//! The modules stand on floors, bottom to top. A module imports only from its own layer and from
//! lower floors; layers on one floor (wings) do not import each other; and no two files import
//! each other in a circle, inside a layer either. `tests/layers.rs` checks all three on every
//! `crate::`, `super::` and child-module path, with the table of layers in one place (a new
//! module is one line there).
//!
//! ```text
//! 7  l4               TCP and UDP services (listeners per port, connect retries, flows); it
//!                     admits connections under the proxy's limits and reads PROXY headers
//! 6  proxy            the request pipeline: server, forward, extauth, mirror (the copies),
//!                     accesslog, error, settings, deadline, proxy_protocol, upgrade
//!                     h1_idle (--http1-server weir), park (idle keep-alive connections
//!                     held by no task), h2_stall (flow-control stalls)
//! 5  proxy::upstream  clients, our HTTP/1.1 codec and its idle pool, the request body sent
//!                     upstream (and the mirror tee), what they share about a connection
//! 4  proxy::headers   the proxy's own ground: hop-by-hop headers, X-Request-ID, forwarded
//!                     headers, the auth-url and mirror URL templates expanded
//! 3  route            compiled with each table: router, policy, canary, cors, auth, realip,
//!                     rewrite_response, retry, mirror (the spec)
//! 2  state            kept across table swaps: balance (+ BackendIdx), ratelimit, connlimit,
//!                     authcache, throttle
//! 1  tls | echo       tls (certificates, configs), mtls, ciphers, sessions, tickets, ocsp,
//!                     options, l4 | echo stands apart (the debugging backend)
//! 0  ground           vars (the nginx-variables language: one parser, one name table, the
//!                     request view templates read), model (+ logformat: the log's templates;
//!                     changes: TableChanges), http_util, hashkey, fast, uri_path (the request
//!                     path as routes see it), metrics (request counters in per-thread
//!                     shards, resolved per route when a table compiles), trace (W3C trace
//!                     context, the sampler, spans and their OTLP exporter), relay (the
//!                     bounded copy of a byte stream both ways with an idle timeout)
//! ```
//!
//! `tls`, `state` and `route` are floors, not wings, for two reasons: a balancer holds its
//! backend's upstream TLS config (state imports tls), and a compiled route holds the limiters
//! and caches that outlive it (route imports state). `state` names no proxy type: each
//! endpoint's state has a generic slot ([`state::balance::EndpointState::slot`]) in which the
//! proxy keeps the endpoint's idle connections.

pub mod echo;
pub mod fast;
pub mod hashkey;
pub mod http_util;
pub mod l4;
pub mod metrics;
pub mod model;
pub mod proxy;
pub(crate) mod relay;
pub mod route;
pub(crate) mod stall;
pub mod state;
pub mod tls;
pub mod trace;
pub mod uri_path;
pub mod vars;
