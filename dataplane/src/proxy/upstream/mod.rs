//! The upstream side of the proxy: the clients (pooled HTTP/1.1, multiplexed h2) and our own
//! HTTP/1.1 codec.

pub(crate) mod client;
pub(crate) mod h1;

/// A backend's balancer as the proxy uses it: each endpoint keeps its idle HTTP/1.1
/// connections in its slot.
pub(crate) type Balancer = crate::state::balance::Balancer<client::Http1Pool>;

/// An endpoint's state as the proxy uses it (see [`Balancer`]).
pub(crate) type EndpointState = crate::state::balance::EndpointState<client::Http1Pool>;
