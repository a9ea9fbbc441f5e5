//! The L2 announcer: answers ARP requests and IPv6 neighbour solicitations for the announced
//! addresses with the interface's MAC, and sends a burst of gratuitous ARP / unsolicited
//! neighbour advertisements when it starts announcing an address.
//!
//! One `AF_PACKET` raw socket per interface and protocol (ARP; IPv6 with a classic BPF filter
//! that lets only ICMPv6 neighbour solicitations through, so the node's IPv6 traffic is not
//! copied to user space). A packet socket sees unicast requests too (the neighbour
//! unreachability probes a client sends to the MAC it holds), which an ICMPv6 socket would not.
//! For IPv6, the interface joins each address's solicited-node multicast group, so that a NIC
//! filtering multicast delivers the solicitations. The addresses are never added to the
//! interface.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::Context as _;
use socket2::{Domain, SockFilter, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::time::Instant;

use super::announce::Announcer;
use super::frame::{self, ETH_P_ARP, ETH_P_IPV6, Mac, Request};

/// How many gratuitous announcements follow a takeover.
pub const BURST_COUNT: u32 = 5;
/// The time between two of them (the burst spans 2 s).
pub const BURST_SPACING: Duration = Duration::from_millis(500);

/// A network interface to announce on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its index.
    pub index: u32,
    /// Its hardware address.
    pub mac: Mac,
}

impl Interface {
    /// Looks `name` up (in sysfs of this network namespace).
    pub fn lookup(name: &str) -> anyhow::Result<Interface> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            anyhow::bail!("invalid interface name {name:?}");
        }
        let dir = std::path::Path::new("/sys/class/net").join(name);
        let read = |file: &str| {
            std::fs::read_to_string(dir.join(file))
                .with_context(|| format!("interface {name}: reading {}", dir.join(file).display()))
        };
        let index =
            read("ifindex")?.trim().parse().with_context(|| format!("interface {name}: bad ifindex"))?;
        let mac = parse_mac(read("address")?.trim())
            .with_context(|| format!("interface {name} has no Ethernet address"))?;
        Ok(Interface { name: name.to_string(), index, mac })
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<Mac> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The interface of the IPv4 default route (`/proc/net/route`), else of the IPv6 one.
pub fn default_route_interface() -> anyhow::Result<String> {
    let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    default_interface_of(&v4, &v6).context("no default route: name the interface with --lb-interface")
}

/// The default route's interface in the texts of `/proc/net/route` and `/proc/net/ipv6_route`.
fn default_interface_of(v4: &str, v6: &str) -> Option<String> {
    let from_v4 = v4.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Iface Destination Gateway Flags RefCnt Use Metric Mask ...; flag 1 = up.
        let up = f.get(3).and_then(|x| u16::from_str_radix(x, 16).ok()).is_some_and(|x| x & 1 == 1);
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000" && up).then(|| f[0].to_string())
    });
    from_v4.or_else(|| {
        v6.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // dst dst_len src src_len next_hop metric refcnt use flags iface
            (f.len() == 10 && f[0].chars().all(|c| c == '0') && f[1] == "00" && f[9] != "lo")
                .then(|| f[9].to_string())
        })
    })
}

// === sockets ===

/// `struct sockaddr_ll` (linux/if_packet.h).
#[repr(C)]
struct LinkAddr {
    family: u16,
    /// Network byte order.
    protocol: [u8; 2],
    ifindex: i32,
    hatype: u16,
    pkttype: u8,
    halen: u8,
    addr: [u8; 8],
}

const AF_PACKET: u16 = 17;

#[allow(unsafe_code)]
// SAFETY: `with_sockaddr` calls `f` with a pointer to `self`, a fully initialised `repr(C)`
// value laid out as the kernel's `struct sockaddr_ll` (u16, be16, i32, u16, u8, u8, u8[8]: 20
// bytes, no padding), and its exact size; the pointer is valid for reads of that many bytes
// for the whole call because `self` is borrowed for the call. That is what the trait asks.
unsafe impl rustix::net::addr::SocketAddrArg for LinkAddr {
    unsafe fn with_sockaddr<R>(
        &self,
        f: impl FnOnce(*const rustix::net::addr::SocketAddrOpaque, rustix::net::addr::SocketAddrLen) -> R,
    ) -> R {
        const _: () = assert!(std::mem::size_of::<LinkAddr>() == 20);
        f(
            std::ptr::from_ref(self).cast(),
            std::mem::size_of::<LinkAddr>() as rustix::net::addr::SocketAddrLen,
        )
    }
}

/// Classic BPF: accept IPv6 frames carrying ICMPv6 type 135 (neighbour solicitation) right after
/// the fixed header, drop everything else.
fn solicitation_filter() -> [SockFilter; 8] {
    const LDH_ABS: u16 = 0x28;
    const LDB_ABS: u16 = 0x30;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    [
        SockFilter::new(LDH_ABS, 0, 0, 12),
        SockFilter::new(JEQ_K, 0, 5, u32::from(ETH_P_IPV6)),
        SockFilter::new(LDB_ABS, 0, 0, 14 + 6),
        SockFilter::new(JEQ_K, 0, 3, 58),
        SockFilter::new(LDB_ABS, 0, 0, 14 + 40),
        SockFilter::new(JEQ_K, 0, 1, 135),
        SockFilter::new(RET_K, 0, 0, 0x0004_0000),
        SockFilter::new(RET_K, 0, 0, 0),
    ]
}

/// A raw packet socket on `interface` receiving frames of `protocol` (filtered by `filter`).
fn packet_socket(
    interface: &Interface,
    protocol: u16,
    filter: Option<&[SockFilter]>,
) -> io::Result<AsyncFd<Socket>> {
    // Protocol 0: nothing is received before the socket is bound to the interface, so no frame
    // of another interface slips in.
    let socket = Socket::new(Domain::PACKET, Type::RAW, None)?;
    if let Some(filter) = filter {
        socket.attach_filter(filter)?;
    }
    let ifindex =
        i32::try_from(interface.index).map_err(|_| io::Error::other("interface index out of range"))?;
    let address = LinkAddr {
        family: AF_PACKET,
        protocol: protocol.to_be_bytes(),
        ifindex,
        hatype: 0,
        pkttype: 0,
        halen: 0,
        addr: [0; 8],
    };
    rustix::net::bind(socket.as_fd(), &address)?;
    socket.set_nonblocking(true)?;
    #[allow(unsafe_code)]
    // SAFETY: `register` needs the fd to stay open and to be the same fd for the whole life of
    // the `AsyncFd`. The `socket2::Socket` owns its fd (an `OwnedFd`, closed only when the socket
    // drops), its `as_raw_fd` always returns that fd, and it is moved into the `AsyncFd`, which
    // only drops it when itself dropped; nothing here calls `into_inner` or closes it otherwise.
    let registered = unsafe { AsyncFd::register(socket) };
    Ok(registered?)
}

// === the announcer ===

/// Answers for the announced addresses on a set of interfaces.
#[derive(Debug)]
pub struct L2Announcer {
    addresses: watch::Sender<BTreeSet<IpAddr>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl L2Announcer {
    /// Opens the sockets of every interface (an error names the interface) and starts
    /// answering; nothing is announced until [`Announcer::announce`].
    pub fn start(interfaces: &[Interface]) -> anyhow::Result<L2Announcer> {
        let (addresses, _) = watch::channel(BTreeSet::new());
        let mut tasks = Vec::new();
        for interface in interfaces {
            let arp = packet_socket(interface, ETH_P_ARP, None).with_context(|| {
                format!("opening an ARP packet socket on {} (needs CAP_NET_RAW)", interface.name)
            })?;
            let ndp = match packet_socket(interface, ETH_P_IPV6, Some(&solicitation_filter())) {
                Ok(s) => Some(s),
                Err(error) => {
                    tracing::warn!(interface = %interface.name, %error, "cannot receive neighbour solicitations; IPv6 addresses are not announced here");
                    None
                }
            };
            // The multicast memberships are held by a UDP socket: joining a group on the
            // interface makes it deliver the group's frames.
            let groups = match std::net::UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0)) {
                Ok(s) => Some(s),
                Err(error) => {
                    tracing::warn!(interface = %interface.name, %error, "cannot join solicited-node groups (IPv6 disabled?)");
                    None
                }
            };
            let speaker = Speaker {
                interface: interface.clone(),
                arp,
                ndp,
                groups,
                current: BTreeSet::new(),
                bursts: Vec::new(),
            };
            tasks.push(tokio::spawn(speaker.run(addresses.subscribe())));
            tracing::info!(interface = %interface.name, mac = %show_mac(&interface.mac), "L2 announcer ready");
        }
        Ok(L2Announcer { addresses, tasks })
    }
}

impl Drop for L2Announcer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Announcer for L2Announcer {
    fn name(&self) -> &'static str {
        "l2"
    }

    fn announce(&mut self, addresses: &BTreeSet<IpAddr>) -> anyhow::Result<()> {
        if let Some(task) = self.tasks.iter().find(|t| t.is_finished()) {
            anyhow::bail!("an interface's announcer stopped ({:?})", task.id());
        }
        self.addresses.send_if_modified(|current| {
            if current == addresses {
                false
            } else {
                current.clone_from(addresses);
                true
            }
        });
        Ok(())
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn show_mac(mac: &Mac) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// One interface's loop.
struct Speaker {
    interface: Interface,
    arp: AsyncFd<Socket>,
    ndp: Option<AsyncFd<Socket>>,
    groups: Option<std::net::UdpSocket>,
    current: BTreeSet<IpAddr>,
    /// Gratuitous announcements still to send: address, how many, when the next.
    bursts: Vec<(IpAddr, u32, Instant)>,
}

impl Speaker {
    async fn run(mut self, mut addresses: watch::Receiver<BTreeSet<IpAddr>>) {
        let mut buf = vec![0u8; 2048];
        loop {
            let next = self.bursts.iter().map(|b| b.2).min();
            tokio::select! {
                changed = addresses.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let new = addresses.borrow_and_update().clone();
                    self.update(new);
                }
                ready = self.arp.readable() => match ready {
                    Ok(mut guard) => {
                        drain(guard.get_inner(), &mut buf, |frame| self.answer(frame, &self.arp));
                        guard.clear_ready();
                    }
                    Err(error) => {
                        tracing::error!(interface = %self.interface.name, %error, "ARP socket failed");
                        return;
                    }
                },
                ready = async {
                    match &self.ndp {
                        Some(s) => s.readable().await,
                        None => std::future::pending().await,
                    }
                } => match ready {
                    Ok(mut guard) => {
                        if let Some(ndp) = &self.ndp {
                            drain(guard.get_inner(), &mut buf, |frame| self.answer(frame, ndp));
                        }
                        guard.clear_ready();
                    }
                    Err(error) => {
                        tracing::error!(interface = %self.interface.name, %error, "NDP socket failed");
                        self.ndp = None;
                    }
                },
                _ = async {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => self.send_due(),
            }
        }
    }

    fn update(&mut self, new: BTreeSet<IpAddr>) {
        let now = Instant::now();
        for added in new.difference(&self.current) {
            tracing::info!(interface = %self.interface.name, address = %added, "announcing");
            if let (IpAddr::V6(a), Some(groups)) = (added, &self.groups)
                && let Err(error) = groups.join_multicast_v6(&frame::solicited_node(a), self.interface.index)
                && error.raw_os_error() != Some(rustix::io::Errno::ADDRINUSE.raw_os_error())
            {
                tracing::warn!(interface = %self.interface.name, address = %added, %error, "cannot join the solicited-node group");
            }
            self.bursts.push((*added, BURST_COUNT, now));
        }
        for removed in self.current.difference(&new) {
            tracing::info!(interface = %self.interface.name, address = %removed, "no longer announcing");
            // Another announced address may share the group: leave it only when none does.
            if let (IpAddr::V6(a), Some(groups)) = (removed, &self.groups) {
                let group = frame::solicited_node(a);
                let shared =
                    new.iter().any(|o| matches!(o, IpAddr::V6(o) if frame::solicited_node(o) == group));
                if !shared {
                    let _ = groups.leave_multicast_v6(&group, self.interface.index);
                }
            }
        }
        self.bursts.retain(|b| new.contains(&b.0));
        self.current = new;
    }

    fn send_due(&mut self) {
        let now = Instant::now();
        let mac = self.interface.mac;
        let mut due = Vec::new();
        for burst in &mut self.bursts {
            if burst.2 <= now {
                due.push(burst.0);
                burst.1 -= 1;
                burst.2 = now + BURST_SPACING;
            }
        }
        self.bursts.retain(|b| b.1 > 0);
        for address in due {
            let (socket, frame) = match address {
                IpAddr::V4(a) => (Some(&self.arp), frame::gratuitous_arp(mac, a)),
                IpAddr::V6(a) => (self.ndp.as_ref(), frame::unsolicited_advertisement(mac, a)),
            };
            if let Some(socket) = socket {
                self.send(socket, &frame, "a gratuitous announcement");
            }
        }
    }

    fn answer(&self, frame: &[u8], socket: &AsyncFd<Socket>) {
        // Frames this interface sends are seen too: never answer ourselves.
        if frame.get(6..12) == Some(&self.interface.mac[..]) {
            return;
        }
        let Some(request) = frame::parse(frame) else { return };
        let target = match request {
            Request::Arp { target, .. } => IpAddr::V4(target),
            Request::Solicit { target, .. } => IpAddr::V6(target),
        };
        if self.current.contains(&target) {
            self.send(socket, &frame::answer(self.interface.mac, &request), "an answer");
        }
    }

    fn send(&self, socket: &AsyncFd<Socket>, frame: &[u8], what: &str) {
        if let Err(error) =
            rustix::net::send(socket.get_ref().as_fd(), frame, rustix::net::SendFlags::empty())
        {
            tracing::warn!(interface = %self.interface.name, %error, "cannot send {what}");
        }
    }
}

/// Reads every frame waiting on `socket`, passing each to `each`.
fn drain(socket: &Socket, buf: &mut [u8], mut each: impl FnMut(&[u8])) {
    loop {
        match rustix::net::recv(socket.as_fd(), &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((len, _)) => each(&buf[..len.min(buf.len())]),
            Err(rustix::io::Errno::AGAIN) => return,
            Err(rustix::io::Errno::INTR) => {}
            Err(error) => {
                // ENETDOWN when the link goes down, for instance: the next readiness retries.
                tracing::debug!(%error, "packet socket receive failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_default_route_interface_is_found() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth1\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  eth0\t00000000\t0102000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(default_interface_of(v4, "").as_deref(), Some("eth0"));
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     ens3\n";
        assert_eq!(default_interface_of("Iface\n", v6).as_deref(), Some("ens3"));
        assert_eq!(default_interface_of("", ""), None);
    }

    #[test]
    fn macs_parse_strictly() {
        assert_eq!(parse_mac("02:00:0a:ff:00:01"), Some([2, 0, 10, 255, 0, 1]));
        assert_eq!(show_mac(&[2, 0, 10, 255, 0, 1]), "02:00:0a:ff:00:01");
        for bad in ["", "02:00:0a:ff:00", "02:00:0a:ff:00:01:02", "zz:00:0a:ff:00:01"] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }
}
