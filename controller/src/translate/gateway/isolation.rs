//! Listener isolation (pure): which socket and which listener a request belongs to.
//!
//! weir serves every Gateway listener of its classes on two sockets: HTTP listeners on
//! `--listen-http`, HTTPS (and TLS) listeners on `--listen-https`. Two rules of the `Listener`
//! documentation decide which routes may answer a request:
//!
//! - **Port isolation**: a route attached to an HTTPS listener answers only requests that came
//!   over TLS, one attached to an HTTP listener only plain-HTTP ones. Each HTTPRoute match
//!   carries the sockets it serves as a [`RequestConditions::tls`] condition (`None` when it
//!   serves both), which the router checks for routes that have conditions only: Ingress
//!   routes pay nothing.
//! - **Hostname isolation** ("Listeners that are distinct only by Hostname": "inbound request
//!   hostnames MUST match from the most specific to least specific Hostname values to choose
//!   the correct Listener and its associated set of Routes"; "a request to `foo.example.com`
//!   SHOULD only be routed using routes attached to the `foo.example.com` Listener (and not the
//!   `*.example.com` Listener)"). Among the ready listeners of a socket (over all Gateways weir
//!   serves), a route's host name that a more specific listener covers is dropped from it
//!   ([`Isolation::claimed`]). The router picks one virtual host per request, the most specific
//!   (exact, then the longest suffix, then any host), so a more specific listener's host name
//!   must have a virtual host of its own, even without routes ([`Isolation::shields`]), and a
//!   less specific host's routes are copied into a more specific virtual host when the
//!   request still belongs to their listener there (another socket's routes, or routes of the
//!   same listener with a broader name: [`Isolation::inherits`]).

use std::collections::BTreeSet;

use weir_dataplane::model::HostMatch;

use super::hostname::Hostname;
use super::listeners::{GatewayOut, Protocol};

/// The socket a listener is served on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Socket {
    /// `--listen-http`: HTTP listeners.
    Http,
    /// `--listen-https`: HTTPS listeners (TLS terminated), and TLS listeners (passthrough, or
    /// terminated and relayed).
    Https,
}

impl Socket {
    /// The socket of a listener's protocol.
    pub fn of(protocol: &Protocol) -> Socket {
        match protocol {
            Protocol::Http => Socket::Http,
            Protocol::Https(_) | Protocol::TlsPassthrough | Protocol::TlsTerminate(_) => Socket::Https,
        }
    }

    /// The [`RequestConditions::tls`](weir_dataplane::model::RequestConditions::tls) value of a
    /// set of sockets: `None` for both.
    pub fn condition(sockets: &BTreeSet<Socket>) -> Option<bool> {
        match (sockets.contains(&Socket::Http), sockets.contains(&Socket::Https)) {
            (true, false) => Some(false),
            (false, true) => Some(true),
            _ => None,
        }
    }
}

/// The host names of the ready HTTP and HTTPS listeners of every Gateway weir serves, by socket
/// (`None`: a listener without hostname).
#[derive(Clone, Debug, Default)]
pub struct Isolation {
    listeners: BTreeSet<(Socket, Option<Hostname>)>,
}

impl Isolation {
    /// The ready HTTP and HTTPS listeners of `gateways` (TLS listeners, passthrough or
    /// terminating, take whole connections by SNI before HTTP routing: they do not take part).
    pub fn new<'a>(gateways: impl IntoIterator<Item = &'a GatewayOut>) -> Isolation {
        let mut listeners = BTreeSet::new();
        for l in gateways.into_iter().flat_map(|g| &g.listeners).filter(|l| l.ready) {
            if let Some(p @ (Protocol::Http | Protocol::Https(_))) = &l.protocol {
                listeners.insert((Socket::of(p), l.hostname.clone()));
            }
        }
        Isolation { listeners }
    }

    /// Whether requests for `host` (`None`: any host) on `socket` belong to a listener more
    /// specific than `listener` (the hostname of the listener a route attached to): then the
    /// route must not answer them.
    pub fn claimed(&self, socket: Socket, listener: Option<&Hostname>, host: Option<&Hostname>) -> bool {
        let Some(host) = host else { return false };
        self.listeners.iter().any(|(s, other)| {
            *s == socket
                && other.as_ref().is_some_and(|other| {
                    strictly_covers(listener, other) && (other == host || other.covers(host))
                })
        })
    }

    /// The listener host names on `socket` that `host` strictly covers: each needs a virtual
    /// host of its own so that the router does not hand its requests to `host`'s routes.
    pub fn shields(&self, socket: Socket, host: Option<&Hostname>) -> Vec<Hostname> {
        self.listeners
            .iter()
            .filter(|(s, _)| *s == socket)
            .filter_map(|(_, other)| other.clone())
            .filter(|other| strictly_covers(host, other))
            .collect()
    }

    /// Whether the routes of a route host `from` (served on `socket` by a listener with
    /// hostname `listener`) also answer in the more specific virtual host `to`: `from` covers
    /// `to`, and no more specific listener on `socket` takes `to`'s requests.
    pub fn inherits(
        &self,
        socket: Socket,
        listener: Option<&Hostname>,
        from: Option<&Hostname>,
        to: &Hostname,
    ) -> bool {
        strictly_covers(from, to) && !self.claimed(socket, listener, Some(to))
    }
}

/// Whether `a` (`None`: any host) covers every name of `b` and more.
pub fn strictly_covers(a: Option<&Hostname>, b: &Hostname) -> bool {
    match a {
        None => true,
        Some(a) => a != b && a.covers(b),
    }
}

/// A Gateway API host name as a virtual host.
pub fn host_match(h: Option<&Hostname>) -> HostMatch {
    match h {
        None => HostMatch::Any,
        Some(Hostname::Exact(n)) => HostMatch::Exact(n.clone()),
        Some(Hostname::Wildcard(s)) => HostMatch::Suffix(s.clone()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn h(s: &str) -> Hostname {
        Hostname::parse(s).unwrap()
    }

    /// The listeners of the conformance test `GatewayHTTPListenerIsolation`
    /// (`gateway-http-listener-isolation-with-hostname-intersection.yaml`).
    fn conformance() -> Isolation {
        let mut listeners = BTreeSet::new();
        for name in [None, Some("*.example.com"), Some("*.foo.example.com"), Some("abc.foo.example.com")] {
            listeners.insert((Socket::Http, name.map(h)));
        }
        Isolation { listeners }
    }

    /// `Listener`: "a request to `foo.example.com` SHOULD only be routed using routes attached
    /// to the `foo.example.com` Listener (and not the `*.example.com` Listener)"; the
    /// conformance manifest's comments: "request matching is prevented by the isolation".
    #[test]
    fn listener_isolation_drops_names_of_more_specific_listeners() {
        let iso = conformance();
        let empty = None;
        let wild = Some(h("*.example.com"));
        let foo = Some(h("*.foo.example.com"));
        let abc = Some(h("abc.foo.example.com"));
        // The empty-hostname listener's route keeps bar.com only.
        assert!(!iso.claimed(Socket::Http, empty.as_ref(), Some(&h("bar.com"))));
        for name in ["*.example.com", "*.foo.example.com", "abc.foo.example.com"] {
            assert!(iso.claimed(Socket::Http, empty.as_ref(), Some(&h(name))), "{name}");
        }
        // A route without hostnames keeps any host (the more specific names get virtual hosts).
        assert!(!iso.claimed(Socket::Http, empty.as_ref(), None));
        // *.example.com keeps itself, loses *.foo.example.com and abc.foo.example.com.
        assert!(!iso.claimed(Socket::Http, wild.as_ref(), Some(&h("*.example.com"))));
        assert!(iso.claimed(Socket::Http, wild.as_ref(), Some(&h("*.foo.example.com"))));
        assert!(iso.claimed(Socket::Http, wild.as_ref(), Some(&h("abc.foo.example.com"))));
        assert!(!iso.claimed(Socket::Http, foo.as_ref(), Some(&h("*.foo.example.com"))));
        assert!(iso.claimed(Socket::Http, foo.as_ref(), Some(&h("abc.foo.example.com"))));
        assert!(!iso.claimed(Socket::Http, abc.as_ref(), Some(&h("abc.foo.example.com"))));
        // Another socket's listeners do not count.
        assert!(!iso.claimed(Socket::Https, empty.as_ref(), Some(&h("abc.foo.example.com"))));
    }

    #[test]
    fn more_specific_listener_names_are_shielded_and_inherit_only_what_they_do_not_claim() {
        let iso = conformance();
        assert_eq!(
            iso.shields(Socket::Http, Some(&h("*.example.com"))),
            vec![h("abc.foo.example.com"), h("*.foo.example.com")]
        );
        assert_eq!(iso.shields(Socket::Https, None), Vec::<Hostname>::new());
        // A route of the *.example.com listener for *.example.com answers in x.example.com (its
        // own listener's), not in abc.foo.example.com (another listener's).
        let wild = h("*.example.com");
        assert!(iso.inherits(Socket::Http, Some(&wild), Some(&wild), &h("x.example.com")));
        assert!(!iso.inherits(Socket::Http, Some(&wild), Some(&wild), &h("abc.foo.example.com")));
        // On the HTTPS socket, with no listeners there, it would.
        assert!(iso.inherits(Socket::Https, Some(&wild), Some(&wild), &h("abc.foo.example.com")));
        assert_eq!(Socket::condition(&BTreeSet::from([Socket::Http])), Some(false));
        assert_eq!(Socket::condition(&BTreeSet::from([Socket::Https])), Some(true));
        assert_eq!(Socket::condition(&BTreeSet::from([Socket::Http, Socket::Https])), None);
    }
}
