//! The upstream side of the proxy: the clients (pooled HTTP/1.1, multiplexed h2) and our own
//! HTTP/1.1 codec.

pub(crate) mod client;
pub(crate) mod h1;
