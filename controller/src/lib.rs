//! weir's controller: sources of Kubernetes objects, their translation into the dataplane's
//! routing table, and the `weir` command line.

pub mod cli;
pub mod gateway;
pub mod gateway_source;
pub mod l4_serve;
pub mod lb_agent;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod metrics_l4;
pub(crate) mod metrics_trace;
pub mod migrate;
pub mod node;
pub mod node_agent;
pub mod serve;
pub mod snapshot;
pub mod source;
pub mod status;
pub mod status_gateway;
pub mod translate;
