//! Making assigned addresses reachable: the announcer seam.
//!
//! An [`Announcer`] is told, after every change, the full set of addresses this node must
//! answer for; it makes the network deliver their traffic here (L2: answer ARP requests and
//! IPv6 neighbour solicitations with this node's MAC and send gratuitous announcements on
//! takeover; later BGP: advertise host routes). Which node announces which address is decided
//! elsewhere (a deterministic choice every node computes alike), so an announcer holds no
//! cluster logic. The addresses are never added to an interface: the node module's rules
//! already accept their traffic.
//!
//! No announcer is implemented yet: `weir node --load-balancer` assigns addresses and programs
//! them, and the LAN must route them to a node (a static route, or an external announcer).

use std::collections::BTreeSet;
use std::net::IpAddr;

/// Makes the network deliver traffic for a set of addresses to this node.
pub trait Announcer: Send {
    /// A short name for logs and metrics (`l2`, `bgp`).
    fn name(&self) -> &'static str;

    /// Announces exactly `addresses` from now on: starts announcing the new ones (a takeover
    /// burst for L2) and stops announcing those no longer listed.
    fn announce(&mut self, addresses: &BTreeSet<IpAddr>) -> anyhow::Result<()>;
}
