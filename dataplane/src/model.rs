//! The routing table: the contract between the controller (which translates Kubernetes
//! objects into it) and the dataplane (which compiles it into lookup structures and serves it).
//!
//! Plain data, serde-serializable, no Kubernetes types. `weir dump` prints it as YAML and the
//! translation golden tests compare it, so every collection here has a deterministic order.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A complete, self-contained routing table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTable {
    /// Stamped by the publisher (a counter); translation leaves it at 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
    /// Virtual hosts, in the order: exact hosts (sorted), wildcard hosts (sorted), then the
    /// any-host entry. Each host appears at most once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<VirtualHost>,
    /// Serves requests that match no virtual host, or no route of their virtual host.
    /// Without it the proxy answers 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_backend: Option<BackendId>,
    /// Every backend a route or the default backend refers to, by identity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backends: BTreeMap<BackendId, Backend>,
    /// TLS entries: which certificate serves which host names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls: Vec<TlsEntry>,
    /// Certificate material referenced by [`TlsEntry::certificate`] and
    /// [`RouteTable::default_certificate`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub certificates: BTreeMap<ObjectRef, Certificate>,
    /// Hosts whose TLS connections are not terminated but spliced to a backend as they are
    /// (ingress-nginx `ssl-passthrough`), sorted by host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passthrough: Vec<Passthrough>,
    /// Hosts that ask TLS clients for a certificate (ingress-nginx `auth-tls-*`), sorted by host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_auth: Vec<ClientAuth>,
    /// The certificate for names no TLS entry covers (a key of [`RouteTable::certificates`]);
    /// `None`: the dataplane's self-signed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_certificate: Option<ObjectRef>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

// === impl HostMatch ===

/// Which `Host` header values a virtual host answers.
///
/// Serialized as a plain string: `example.com`, `*.example.com`, or `*` for any host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostMatch {
    /// One host name, lower case, without port.
    Exact(String),
    /// `*.suffix`: matches exactly one extra DNS label in front of the suffix (stored without `*.`).
    Wildcard(String),
    /// Any host (Ingress rules without `host`).
    Any,
}

/// A host name that cannot be a [`HostMatch`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid host {host:?}: {reason}")]
pub struct InvalidHost {
    /// The rejected input.
    pub host: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

impl HostMatch {
    /// Parses an Ingress-style host: `a.example.com`, `*.example.com`, or `*`/empty for any host.
    /// The result is lower-cased; IP addresses and ports are not host names and are rejected.
    pub fn parse(host: &str) -> Result<Self, InvalidHost> {
        let invalid = |reason| InvalidHost { host: host.to_string(), reason };
        if host.is_empty() || host == "*" {
            return Ok(HostMatch::Any);
        }
        let lower = host.to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        if name.contains('*') {
            return Err(invalid("a wildcard is only allowed as the whole first label (`*.example.com`)"));
        }
        if name.len() > 253 {
            return Err(invalid("longer than 253 characters"));
        }
        if name.parse::<std::net::IpAddr>().is_ok() {
            return Err(invalid("an IP address is not a host name"));
        }
        for label in name.split('.') {
            if label.is_empty() || label.len() > 63 {
                return Err(invalid("each DNS label must be 1 to 63 characters"));
            }
            let ok = label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(invalid("DNS labels are letters, digits and inner hyphens"));
            }
        }
        if wildcard && !name.contains('.') {
            // `*.com` would cover a whole top-level domain; the Ingress API refuses it too.
            return Err(invalid("a wildcard needs at least two labels after `*.`"));
        }
        Ok(if wildcard { HostMatch::Wildcard(name.to_string()) } else { HostMatch::Exact(name.to_string()) })
    }

    /// Whether a request host (lower case, port already removed) matches.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(h) => h == host,
            HostMatch::Wildcard(suffix) => host
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|label| !label.is_empty() && !label.contains('.')),
            HostMatch::Any => true,
        }
    }
}

impl fmt::Display for HostMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostMatch::Exact(h) => f.write_str(h),
            HostMatch::Wildcard(s) => write!(f, "*.{s}"),
            HostMatch::Any => f.write_str("*"),
        }
    }
}

impl Serialize for HostMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HostMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        HostMatch::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// One virtual host: a host match and its routes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtualHost {
    /// Which hosts this entry answers.
    pub host: HostMatch,
    /// Routes of this host. Order is not significant: the router applies Ingress precedence
    /// (Exact before Prefix, longer prefix first). Translation emits them sorted for stable output.
    pub routes: Vec<Route>,
}

/// How a route matches the request path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    /// The path equals this, byte for byte (query excluded).
    Exact(String),
    /// Element-wise prefix by `/`: `/foo` matches `/foo`, `/foo/`, `/foo/bar`, not `/foobar`.
    /// Stored without a trailing slash (except the root `/`).
    Prefix(String),
    /// A regular expression (ingress-nginx `use-regex`), anchored at the start of the path.
    Regex(String),
}

/// One route: a path match, what to do with matching requests, and its policies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The path match.
    pub path: PathMatch,
    /// What happens to a matching request.
    pub action: RouteAction,
    /// Per-route policies; later issues add rewrites, timeouts, auth and so on.
    #[serde(default, skip_serializing_if = "RoutePolicy::is_empty")]
    pub policy: RoutePolicy,
    /// The object this route came from (an Ingress), for logs and error responses.
    pub origin: ObjectRef,
}

/// What a route does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteAction {
    /// Proxy to a backend.
    Forward(BackendId),
}

/// Per-route policies: rewrites, timeouts, weights, affinity and auth land here as typed fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutePolicy {
    /// Plain-HTTP requests get a `308` to the same URL over HTTPS (ingress-nginx `ssl-redirect`,
    /// `force-ssl-redirect`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ssl_redirect: bool,
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl RoutePolicy {
    /// True when no policy is set (used to keep serialized tables short).
    pub fn is_empty(&self) -> bool {
        *self == RoutePolicy::default()
    }
}

// === impl BackendId ===

/// Identity of a backend: a Service port, `namespace/service:port`.
///
/// Serialized as that string, so it can be a map key in YAML and JSON.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendId {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub service: String,
    /// The Service port, as the Ingress named it.
    pub port: ServicePort,
}

/// A Service port as an Ingress backend names it: by number or by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServicePort {
    /// `port.number`.
    Number(u16),
    /// `port.name`.
    Name(String),
}

impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServicePort::Number(n) => write!(f, "{n}"),
            ServicePort::Name(n) => f.write_str(n),
        }
    }
}

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.service, self.port)
    }
}

/// A string that is not `namespace/service:port`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid backend id {0:?}: expected namespace/service:port")]
pub struct InvalidBackendId(pub String);

impl FromStr for BackendId {
    type Err = InvalidBackendId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || InvalidBackendId(s.to_string());
        let (namespace, rest) = s.split_once('/').ok_or_else(err)?;
        let (service, port) = rest.rsplit_once(':').ok_or_else(err)?;
        if namespace.is_empty() || service.is_empty() || port.is_empty() {
            return Err(err());
        }
        let port = match port.parse::<u16>() {
            Ok(n) => ServicePort::Number(n),
            Err(_) => ServicePort::Name(port.to_string()),
        };
        Ok(BackendId { namespace: namespace.to_string(), service: service.to_string(), port })
    }
}

impl Serialize for BackendId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BackendId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A named upstream cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// The protocol spoken to the upstream.
    #[serde(default, skip_serializing_if = "is_default")]
    pub protocol: UpstreamProtocol,
    /// Where the backend's traffic goes.
    pub target: Target,
    /// TLS towards the upstream, for the `https` and `h2` protocols.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
}

/// How weir verifies an upstream's certificate (ingress-nginx `proxy-ssl-*`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// CA certificates (PEM) to verify against; `None`: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// The name to verify (and send as SNI); `None`: the request's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Do not verify the certificate at all (only when explicitly asked: `proxy-ssl-verify: "off"`
    /// together with a `backend-protocol` of HTTPS/GRPCS).
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure_skip_verify: bool,
    /// Do not send SNI (`proxy-ssl-server-name: "off"`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_sni: bool,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Where a backend's traffic goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Ready endpoints only (sorted by address). Empty: the backend answers 503.
    Endpoints(Vec<Endpoint>),
    /// An ExternalName Service: resolved by DNS when connecting.
    Dns {
        /// The DNS name.
        host: String,
        /// The port to connect to.
        port: u16,
    },
}

/// One upstream endpoint ready to receive traffic.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// Socket address to connect to.
    pub address: SocketAddr,
    /// Relative weight for balancing (1 unless a policy says otherwise).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

impl Endpoint {
    /// An endpoint with weight 1.
    pub fn new(address: SocketAddr) -> Self {
        Endpoint { address, weight: 1 }
    }
}

/// Protocol used towards the upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 in clear text.
    #[default]
    Http1,
    /// HTTP/2 in clear text, prior knowledge (h2c; also gRPC).
    H2c,
    /// HTTP/1.1 over TLS (`backend-protocol: HTTPS`).
    Https,
    /// HTTP/2 over TLS, ALPN `h2` (`backend-protocol: GRPCS`).
    H2,
}

impl UpstreamProtocol {
    /// Spoken over HTTP/2.
    pub fn is_h2(self) -> bool {
        matches!(self, UpstreamProtocol::H2c | UpstreamProtocol::H2)
    }

    /// Spoken over TLS.
    pub fn is_tls(self) -> bool {
        matches!(self, UpstreamProtocol::Https | UpstreamProtocol::H2)
    }
}

/// A reference to a namespaced Kubernetes-style object, used for origins and certificate ids.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// Builds a reference.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectRef { namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Serialize for ObjectRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ObjectRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ObjectRef::new(ns, name))
            }
            _ => Err(serde::de::Error::custom(format!(
                "invalid object reference {s:?}: expected namespace/name"
            ))),
        }
    }
}

/// Host names served by one certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsEntry {
    /// Host names (exact or `*.` wildcard) this entry covers.
    pub hosts: Vec<HostMatch>,
    /// The certificate (a key of [`RouteTable::certificates`]); `None` means the default certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<ObjectRef>,
}

/// A TLS passthrough host: connections whose SNI it matches go to `backend` undecrypted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Passthrough {
    /// The SNI name (exact or `*.` wildcard).
    pub host: HostMatch,
    /// The backend that terminates TLS itself (also in [`RouteTable::backends`]).
    pub backend: BackendId,
}

/// Client certificate authentication of one host (mTLS).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAuth {
    /// The host (exact or `*.` wildcard); the connection's SNI selects it.
    pub host: HostMatch,
    /// CA certificates (PEM) client certificates must chain to.
    pub ca_pem: String,
    /// What happens without a valid certificate.
    pub verify: ClientVerify,
    /// Longest accepted client chain, the client certificate included (`auth-tls-verify-depth`).
    pub depth: u8,
    /// Forward the client certificate upstream, URL-encoded PEM in `ssl-client-cert`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pass_certificate: bool,
}

/// `auth-tls-verify-client`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientVerify {
    /// A valid certificate is required (else 400).
    On,
    /// A certificate is optional, but if sent it must be valid (else 400).
    Optional,
    /// A certificate is optional and not required to be valid; the result is passed upstream.
    OptionalNoCa,
}

/// PEM-encoded certificate chain and private key, as found in a `kubernetes.io/tls` Secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    /// The certificate chain, leaf first (PEM).
    pub chain_pem: String,
    /// The private key (PEM). Serialized as `<redacted>` so that `weir dump`, logs and golden
    /// files never carry key material; tables are handed to the dataplane as values, not text.
    #[serde(serialize_with = "redact")]
    pub key_pem: String,
}

fn redact<S: Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("<redacted>")
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.debug_struct("Certificate").field("chain_pem_len", &self.chain_pem.len()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_match_parses_and_matches() {
        let w = HostMatch::parse("*.Example.com").unwrap();
        assert_eq!(w, HostMatch::Wildcard("example.com".into()));
        assert!(w.matches("a.example.com"));
        assert!(!w.matches("example.com"));
        assert!(!w.matches("a.b.example.com"));
        assert!(!w.matches(".example.com"));
        assert!(!w.matches("aexample.com"));
        assert_eq!(HostMatch::parse("").unwrap(), HostMatch::Any);
        assert_eq!(HostMatch::parse("Foo.COM").unwrap(), HostMatch::Exact("foo.com".into()));
        assert!(HostMatch::parse("a.*.com").is_err());
        assert!(HostMatch::parse("*.com").is_err());
        assert!(HostMatch::parse("10.0.0.1").is_err());
        assert!(HostMatch::parse("foo_bar.com").is_err());
    }

    #[test]
    fn backend_id_round_trips() {
        let id: BackendId = "default/web:http".parse().unwrap();
        assert_eq!(id.port, ServicePort::Name("http".into()));
        assert_eq!(id.to_string(), "default/web:http");
        let id: BackendId = "ns/svc:8080".parse().unwrap();
        assert_eq!(id.port, ServicePort::Number(8080));
        assert!("nope".parse::<BackendId>().is_err());
        assert!("ns/:80".parse::<BackendId>().is_err());
    }

    #[test]
    fn table_round_trips_through_yaml() {
        let mut table = RouteTable::default();
        let id: BackendId = "default/web:80".parse().unwrap();
        table.hosts.push(VirtualHost {
            host: HostMatch::parse("*.example.com").unwrap(),
            routes: vec![Route {
                path: PathMatch::Prefix("/api".into()),
                action: RouteAction::Forward(id.clone()),
                policy: RoutePolicy::default(),
                origin: ObjectRef::new("default", "web"),
            }],
        });
        table.backends.insert(
            id,
            Backend {
                protocol: UpstreamProtocol::Http1,
                target: Target::Endpoints(vec![Endpoint::new("127.0.0.1:8080".parse().unwrap())]),
                tls: None,
            },
        );
        let yaml = serde_saphyr::to_string(&table).unwrap();
        let back: RouteTable = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, table, "{yaml}");
    }
}
