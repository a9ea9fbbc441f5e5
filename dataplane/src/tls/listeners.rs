//! Misdirected requests on Gateway HTTPS listeners (pure): which listener a name belongs to.
//!
//! Gateway API `Listener.hostname` (citing RFC 7540 §9.1.2): "Gateways SHOULD match the
//! authority of the requests with all the SNI hostname(s) configured across all the Gateway
//! Listeners on the same port and protocol: If another Listener has an exact match or more
//! specific wildcard entry, the Gateway SHOULD return a 421. If the current Listener (selected
//! by SNI matching during ClientHello) does not match the Host: If another Listener does match
//! the Host, the Gateway SHOULD return a 421. If no other Listener matches the Host, the
//! Gateway MUST return a 404."
//!
//! The TLS entries of the table that carry a [`TlsEntry::listener`] are the listeners of the
//! HTTPS socket. A name belongs to the entry the certificate resolver would choose for it as an
//! SNI (exact, then one-label wildcard, then the longest suffix, then an entry for any name;
//! the same order as the certificate resolver, `CertIndex::resolve`). On a connection whose SNI belongs to a
//! listener, a request whose host belongs to another listener is misdirected (421), and one
//! whose host belongs to no listener (an Ingress's `spec.tls` name, or none) is answered 404.
//! Connections whose SNI chose an Ingress's certificate, the default one or none keep routing
//! by `Host` alone, as ingress-nginx does.

use std::collections::HashMap;

use crate::model::{HostMatch, RouteTable, TlsEntry};

/// Who a name belongs to: the index of its TLS entry in the table.
type Owner = usize;

/// Compiled name → TLS entry lookup of one table, for the listener check.
#[derive(Default)]
pub struct ListenerIndex {
    exact: HashMap<String, Owner>,
    /// Keyed by the suffix after `*.` (one label in front).
    wildcard: HashMap<String, Owner>,
    /// Gateway API `*.suffix` names (one or more labels in front), longest suffix first.
    suffix: Vec<(String, Owner)>,
    any: Option<Owner>,
    /// The Gateway listener of each entry (`None`: an Ingress's); empty when the table has no
    /// listener (the check is then skipped).
    listener: Vec<Option<String>>,
}

/// What the listener check says about a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The host belongs to the connection's listener (or the connection is not a listener's):
    /// route it.
    Route,
    /// The host belongs to another listener of the socket: 421.
    Misdirected,
    /// The connection is a listener's and no listener takes the host: 404.
    NoListener,
}

impl ListenerIndex {
    /// Compiles the table's TLS entries; empty when none of them is a Gateway listener's.
    pub fn compile(table: &RouteTable) -> ListenerIndex {
        let mut index = ListenerIndex::default();
        if !table.tls.iter().any(|t| t.listener.is_some()) {
            return index;
        }
        for (owner, entry) in table.tls.iter().enumerate() {
            index.listener.push(entry.listener.clone());
            for host in &entry.hosts {
                match host {
                    HostMatch::Exact(h) => {
                        index.exact.entry(h.to_ascii_lowercase()).or_insert(owner);
                    }
                    HostMatch::Wildcard(s) => {
                        index.wildcard.entry(s.to_ascii_lowercase()).or_insert(owner);
                    }
                    HostMatch::Any => {
                        index.any.get_or_insert(owner);
                    }
                    HostMatch::Suffix(s) => {
                        let s = s.to_ascii_lowercase();
                        if !index.suffix.iter().any(|(have, _)| *have == s) {
                            index.suffix.push((s, owner));
                        }
                    }
                }
            }
        }
        index.suffix.sort_by(|(a, _), (b, _)| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        index
    }

    /// Whether the table has no Gateway listener (no request is checked).
    pub fn is_empty(&self) -> bool {
        self.listener.is_empty()
    }

    /// The TLS entry a name (lower case, no port, no trailing dot) belongs to.
    fn owner(&self, name: &str) -> Option<Owner> {
        if let Some(owner) = self.exact.get(name) {
            return Some(*owner);
        }
        if let Some((_, suffix)) = name.split_once('.')
            && let Some(owner) = self.wildcard.get(suffix)
        {
            return Some(*owner);
        }
        if let Some((_, owner)) = self.suffix.iter().find(|(s, _)| under_suffix(s, name)) {
            return Some(*owner);
        }
        self.any
    }

    /// The Gateway listener (`namespace/gateway/listener`) a name (lower case, no port; `""`
    /// for a ClientHello without SNI) belongs to, if its TLS entry is a listener's: the entry
    /// the certificate resolver would choose for it as an SNI.
    pub fn listener_of(&self, name: &str) -> Option<&str> {
        if self.is_empty() {
            return None;
        }
        self.owner(name).and_then(|o| self.listener.get(o)).and_then(|l| l.as_deref())
    }

    /// The verdict on a request for `host` (normalized: no port) on a connection whose
    /// ClientHello named `sni`.
    pub fn check(&self, sni: &str, host: &str) -> Verdict {
        let is_listener =
            |owner: Option<Owner>| owner.is_some_and(|o| matches!(self.listener.get(o), Some(Some(_))));
        let sni = sni.trim_end_matches('.').to_ascii_lowercase();
        let connection = self.owner(&sni);
        if !is_listener(connection) {
            return Verdict::Route;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let request = self.owner(&host);
        if request == connection {
            Verdict::Route
        } else if is_listener(request) {
            Verdict::Misdirected
        } else {
            Verdict::NoListener
        }
    }
}

/// Whether `name` ends in `.suffix` with one or more labels in front (Gateway API `*.suffix`).
fn under_suffix(suffix: &str, name: &str) -> bool {
    name.strip_suffix(suffix)
        .and_then(|head| head.strip_suffix('.'))
        .is_some_and(|head| !head.is_empty() && !head.starts_with('.') && !head.ends_with('.'))
}

/// The TLS entry of a Gateway listener, for tests and the controller.
pub fn listener_entry(host: HostMatch, certificate: crate::model::ObjectRef, listener: &str) -> TlsEntry {
    TlsEntry {
        hosts: vec![host],
        certificate: Some(certificate),
        listener: Some(listener.to_owned()),
        alternatives: Vec::new(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::ObjectRef;

    fn cert(name: &str) -> ObjectRef {
        ObjectRef { namespace: "default".into(), name: name.into() }
    }

    fn table(entries: Vec<TlsEntry>) -> RouteTable {
        RouteTable { tls: entries, ..RouteTable::default() }
    }

    fn listener(host: &str, name: &str) -> TlsEntry {
        let host = match host.strip_prefix("*.") {
            Some(suffix) => HostMatch::Suffix(suffix.into()),
            None => HostMatch::Exact(host.into()),
        };
        listener_entry(host, cert(name), name)
    }

    /// `Listener.hostname`, RFC 7540 §9.1.2: the three outcomes, for exact and wildcard
    /// listeners of one socket.
    #[test]
    fn listener_hostname_misdirected_requests_get_421_and_names_of_no_listener_404() {
        let index = ListenerIndex::compile(&table(vec![
            listener("a.example.com", "a"),
            listener("*.example.com", "wild"),
            listener("c.other.test", "c"),
        ]));
        assert!(!index.is_empty());
        // The connection's own listener.
        assert_eq!(index.check("a.example.com", "a.example.com"), Verdict::Route);
        assert_eq!(index.check("A.Example.com.", "a.example.COM"), Verdict::Route);
        assert_eq!(index.check("x.example.com", "y.z.example.com"), Verdict::Route, "same wildcard listener");
        // "If the current Listener does not match the Host: if another Listener does match the
        // Host, the Gateway SHOULD return a 421."
        assert_eq!(index.check("a.example.com", "b.example.com"), Verdict::Misdirected);
        assert_eq!(index.check("a.example.com", "c.other.test"), Verdict::Misdirected);
        // "If another Listener has an exact match or more specific wildcard entry, the Gateway
        // SHOULD return a 421." (SNI x.example.com selected *.example.com, which covers
        // a.example.com too.)
        assert_eq!(index.check("x.example.com", "a.example.com"), Verdict::Misdirected);
        // "If no other Listener matches the Host, the Gateway MUST return a 404."
        assert_eq!(index.check("a.example.com", "nobody.test"), Verdict::NoListener);
        // A connection whose SNI no listener takes is not checked.
        assert_eq!(index.check("nobody.test", "a.example.com"), Verdict::Route);
    }

    /// The listeners and cases of the conformance test
    /// `HTTPRouteHTTPSListenerDetectMisdirectedRequests` (v1.6.1: Gateway
    /// `same-namespace-with-https-listener`, one certificate for all four listeners). `Route`
    /// is the test's 200, or its 404 from the listener's own routes (which have no route for
    /// `unknown-example.org`).
    #[test]
    fn conformance_https_listener_detect_misdirected_requests() {
        let any = TlsEntry {
            hosts: vec![HostMatch::Any],
            certificate: Some(cert("shared")),
            listener: Some("https".into()),
            alternatives: Vec::new(),
        };
        let index = ListenerIndex::compile(&table(vec![
            any,
            listener("second-example.org", "https-with-hostname"),
            listener("*.wildcard.org", "https-with-wildcard-hostname"),
            listener("fourth-example.wildcard.org", "https-with-hostname-matching-wildcard"),
        ]));
        use Verdict::{Misdirected as M, Route as R};
        for (sni, host, want) in [
            ("example.org", "example.org", R),
            ("example.org", "second-example.org", M),
            ("example.org", "unknown-example.org", R),
            ("second-example.org", "second-example.org", R),
            ("second-example.org", "example.org", M),
            ("second-example.org", "unknown-example.org", M),
            ("third-example.wildcard.org", "third-example.wildcard.org", R),
            ("third-example.wildcard.org", "fith-example.wildcard.org", R),
            ("third-example.wildcard.org", "fourth-example.wildcard.org", M),
            ("third-example.wildcard.org", "second-example.org", M),
            ("third-example.wildcard.org", "unknown-example.org", M),
            ("fourth-example.wildcard.org", "fourth-example.wildcard.org", R),
            ("fourth-example.wildcard.org", "fith-example.wildcard.org", M),
            ("unknown-example.org", "example.org", R),
            ("unknown-example.org", "unknown-example.org", R),
        ] {
            assert_eq!(index.check(sni, host), want, "SNI {sni}, Host {host}");
        }
    }

    #[test]
    fn ingress_names_are_not_listeners_and_a_table_without_listeners_is_not_checked() {
        let ingress = TlsEntry {
            hosts: vec![HostMatch::Exact("ing.example.com".into())],
            certificate: Some(cert("ing")),
            listener: None,
            alternatives: Vec::new(),
        };
        assert!(ListenerIndex::compile(&table(vec![ingress.clone()])).is_empty());
        let index = ListenerIndex::compile(&table(vec![ingress, listener("*.example.com", "wild")]));
        // An Ingress connection routes by Host, as before.
        assert_eq!(index.check("ing.example.com", "x.example.com"), Verdict::Route);
        // A listener's connection asking for an Ingress's name: no listener takes it.
        assert_eq!(index.check("x.example.com", "ing.example.com"), Verdict::NoListener);
    }

    #[test]
    fn a_listener_without_hostname_takes_the_names_no_other_listener_takes() {
        let index = ListenerIndex::compile(&table(vec![
            listener("a.example.com", "a"),
            TlsEntry {
                hosts: vec![HostMatch::Any],
                certificate: Some(cert("any")),
                listener: Some("any".into()),
                alternatives: Vec::new(),
            },
        ]));
        assert_eq!(index.check("x.test", "y.test"), Verdict::Route);
        assert_eq!(index.check("x.test", "a.example.com"), Verdict::Misdirected);
        assert_eq!(index.check("a.example.com", "y.test"), Verdict::Misdirected);
    }
}
