//! The upstream side of the proxy, beneath the request pipeline: the clients ([`client`]:
//! pooled HTTP/1.1, multiplexed h2), our own HTTP/1.1 codec and its idle pool ([`h1`]), the
//! request body sent upstream ([`body`]) and what they share about a connection ([`conn`]).

pub(crate) mod body;
pub(crate) mod client;
pub(crate) mod conn;
pub(crate) mod h1;

/// A backend's balancer as the proxy uses it: each endpoint keeps its idle HTTP/1.1
/// connections in its slot.
pub(crate) type Balancer = crate::state::balance::Balancer<h1::Http1Pool>;

/// An endpoint's state as the proxy uses it (see [`Balancer`]).
pub(crate) type EndpointState = crate::state::balance::EndpointState<h1::Http1Pool>;
