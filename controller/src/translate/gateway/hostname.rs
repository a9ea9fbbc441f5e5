//! Gateway API host names: listener and route `hostname(s)`, and their intersection.
//!
//! Unlike an Ingress wildcard (one label), a Gateway API wildcard is a suffix match: "Hostnames
//! that are prefixed with a wildcard label (`*.`) are interpreted as a suffix match. That means
//! that a match for `*.example.com` would match both `test.example.com`, and
//! `foo.test.example.com`, but not `example.com`" (`Listener.hostname`, `HTTPRouteSpec.hostnames`).

use std::fmt;

use weir_dataplane::model::HostMatch;

/// A valid Gateway API host name: RFC 1123, no IP address, optionally `*.`-prefixed; lower case.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hostname {
    /// One name.
    Exact(String),
    /// `*.suffix`: every name ending in `.suffix` (stored without `*.`), however many labels.
    Wildcard(String),
}

/// Why a host name is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid hostname {host:?}: {reason}")]
pub struct InvalidHostname {
    /// As written.
    pub host: String,
    /// Why.
    pub reason: String,
}

impl Hostname {
    /// Parses a hostname field (`Hostname` in the API: RFC 1123, `*.` only as the whole first
    /// label, no IP address).
    pub fn parse(host: &str) -> Result<Hostname, InvalidHostname> {
        let invalid = |reason: String| InvalidHostname { host: host.to_string(), reason };
        let lower = host.to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        // The rest is one exact name (`*.com` is a valid Gateway API wildcard, unlike an
        // Ingress host).
        match HostMatch::parse(name).map_err(|e| invalid(e.reason.to_string()))? {
            HostMatch::Exact(name) if wildcard => Ok(Hostname::Wildcard(name)),
            HostMatch::Exact(name) => Ok(Hostname::Exact(name)),
            HostMatch::Wildcard(_) | HostMatch::Any | HostMatch::Suffix(_) => {
                Err(invalid("a hostname is a name, optionally prefixed by `*.`".into()))
            }
        }
    }

    /// Whether this name (or pattern) covers `other` entirely: an exact name covers itself; a
    /// wildcard covers names and narrower wildcards ending in `.suffix`.
    pub fn covers(&self, other: &Hostname) -> bool {
        match (self, other) {
            (Hostname::Exact(a), Hostname::Exact(b)) => a == b,
            (Hostname::Exact(_), Hostname::Wildcard(_)) => false,
            (Hostname::Wildcard(s), Hostname::Exact(b)) => is_below(b, s),
            (Hostname::Wildcard(s), Hostname::Wildcard(t)) => s == t || is_below(t, s),
        }
    }

    /// The names both match, as one hostname, if any: the narrower of the two when one covers
    /// the other (two names that merely overlap, such as two different exact names, have none).
    pub fn intersect(&self, other: &Hostname) -> Option<Hostname> {
        if self.covers(other) {
            Some(other.clone())
        } else if other.covers(self) {
            Some(self.clone())
        } else {
            None
        }
    }

    /// Characters of the name as written (`*.` included), for precedence ("Characters in a
    /// matching hostname").
    pub fn len(&self) -> usize {
        match self {
            Hostname::Exact(n) => n.len(),
            Hostname::Wildcard(s) => s.len() + 2,
        }
    }

    /// Always false: a hostname is never empty (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Whether `name` ends with `.suffix` (at least one more label).
fn is_below(name: &str, suffix: &str) -> bool {
    name.strip_suffix(suffix).is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hostname::Exact(n) => f.write_str(n),
            Hostname::Wildcard(s) => write!(f, "*.{s}"),
        }
    }
}

/// The host names a route serves on a listener (`HTTPRouteSpec.hostnames`): `None` for any
/// host; `Some(names)` otherwise, empty when listener and route both name hosts and none
/// intersect (the route is then not accepted: `NoMatchingListenerHostname`).
///
/// "If both the Listener and HTTPRoute have specified hostnames, any HTTPRoute hostnames that
/// do not match the Listener hostname MUST be ignored."
pub fn effective(listener: Option<&Hostname>, route: &[Hostname]) -> Option<Vec<Hostname>> {
    match (listener, route.is_empty()) {
        (None, true) => None,
        (None, false) => Some(dedup(route.to_vec())),
        (Some(l), true) => Some(vec![l.clone()]),
        (Some(l), false) => Some(dedup(route.iter().filter_map(|r| l.intersect(r)).collect())),
    }
}

fn dedup(mut names: Vec<Hostname>) -> Vec<Hostname> {
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn h(s: &str) -> Hostname {
        Hostname::parse(s).unwrap()
    }

    /// `Listener.hostname`: "`*.example.com` would match both `test.example.com`, and
    /// `foo.test.example.com`, but not `example.com`".
    #[test]
    fn listener_hostname_wildcard_is_a_suffix_match() {
        assert!(h("*.example.com").covers(&h("test.example.com")));
        assert!(h("*.example.com").covers(&h("foo.test.example.com")));
        assert!(!h("*.example.com").covers(&h("example.com")));
        assert!(!h("*.example.com").covers(&h("badexample.com")));
        assert!(h("*.example.com").covers(&h("*.test.example.com")));
    }

    /// `HTTPRouteSpec.hostnames`: "A Listener with `test.example.com` as the hostname matches
    /// HTTPRoutes that have either not specified any hostnames, or have specified at least one
    /// of `test.example.com` or `*.example.com`."
    #[test]
    fn httproute_hostnames_exact_listener() {
        let l = h("test.example.com");
        assert_eq!(effective(Some(&l), &[]), Some(vec![l.clone()]));
        assert_eq!(effective(Some(&l), &[h("*.example.com")]), Some(vec![l.clone()]));
        assert_eq!(effective(Some(&l), &[h("test.example.com")]), Some(vec![l.clone()]));
        assert_eq!(effective(Some(&l), &[h("other.example.com")]), Some(vec![]));
    }

    /// `HTTPRouteSpec.hostnames`: "A Listener with `*.example.com` as the hostname matches
    /// HTTPRoutes that have … specified at least one hostname that matches the Listener
    /// hostname. For example, `*.example.com`, `test.example.com`, and `foo.test.example.com`
    /// would all match. On the other hand, `example.com` and `test.example.net` would not
    /// match." And: "`test.example.net` must not be considered for a match."
    #[test]
    fn httproute_hostnames_wildcard_listener() {
        let l = h("*.example.com");
        for name in ["*.example.com", "test.example.com", "foo.test.example.com"] {
            assert_eq!(effective(Some(&l), &[h(name)]), Some(vec![h(name)]), "{name}");
        }
        for name in ["example.com", "test.example.net"] {
            assert_eq!(effective(Some(&l), &[h(name)]), Some(vec![]), "{name}");
        }
        assert_eq!(
            effective(Some(&l), &[h("test.example.com"), h("test.example.net")]),
            Some(vec![h("test.example.com")])
        );
        // A broader route wildcard narrows to the listener's.
        assert_eq!(effective(Some(&l), &[h("*.com")]), Some(vec![l.clone()]));
    }

    #[test]
    fn no_hostnames_anywhere_is_any_host() {
        assert_eq!(effective(None, &[]), None);
        assert_eq!(
            effective(None, &[h("b.example"), h("a.example"), h("a.example")]),
            Some(vec![h("a.example"), h("b.example")])
        );
    }

    #[test]
    fn invalid_hostnames_are_refused() {
        for bad in ["", "*", "*.", "10.0.0.1", "a.*.example.com", "*.*.example.com", "exa mple.com"] {
            assert!(Hostname::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(h("Foo.Example.COM"), Hostname::Exact("foo.example.com".into()));
    }
}
