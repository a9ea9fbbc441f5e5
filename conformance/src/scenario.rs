//! The scenario file format (`scenarios/<name>.yaml`), its validation and placeholders.
//!
//! See `conformance/README.md` for the format as a scenario author sees it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

/// Errors of loading or validating a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The scenario file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a scenario.
    #[error("{path}: {reason}")]
    Parse {
        /// The scenario file.
        path: String,
        /// What the YAML parser says.
        reason: String,
    },
    /// The scenario parses but says something impossible.
    #[error("{at}: {reason}")]
    Invalid {
        /// Where: the step and expectation.
        at: String,
        /// What is wrong.
        reason: String,
    },
}

/// A `Result` of this module.
pub type Result<T, E = ScenarioError> = std::result::Result<T, E>;

/// One conformance scenario: echo backends, then steps applying manifests and checking requests.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What the scenario checks, in a sentence or two.
    pub description: String,
    /// Echo backends by name, with their number of replicas. Replica `i` of backend `a` answers
    /// with the echo name `a-i`.
    #[serde(default)]
    pub backends: BTreeMap<String, u16>,
    /// Whether the scenario needs a memcached (the `global-rate-limit` annotations): one is
    /// started for it, at `{{ip:memcached}}` and `{{port:memcached}}`.
    #[serde(default)]
    pub memcached: bool,
    /// The steps, run in order against one weir.
    pub steps: Vec<Step>,
}

/// One step: change the manifests directory, wait for weir to reload, check requests.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// A short name for messages (defaults to the step's number).
    #[serde(default)]
    pub name: Option<String>,
    /// Files to write (created or replaced) in the manifests directory: name → YAML text, with
    /// placeholders.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Files to delete from the manifests directory.
    #[serde(default)]
    pub delete: Vec<String>,
    /// What the step waits for after changing files.
    #[serde(default)]
    pub reload: Reload,
    /// Milliseconds to wait before the step changes anything (so that objects it creates are
    /// younger, by the API server's one-second `creationTimestamp`, than the earlier ones).
    #[serde(default)]
    pub pause_ms: u64,
    /// The requests to check once the step's changes are live.
    #[serde(default)]
    pub expect: Vec<Expect>,
    /// Status conditions the objects must carry once the step's changes are live; checked only
    /// through an API server (weir writes status there), waited for up to 20 s.
    #[serde(default)]
    pub conditions: Vec<ConditionExpect>,
    /// Why this step cannot run through an API server (it is skipped there, and the report says
    /// so): for objects the test API server refuses, such as a ReferenceGrant to core kinds.
    #[serde(default)]
    pub manifests_only: Option<String>,
}

/// A status condition one Gateway API object must carry (through an API server only).
///
/// Its `observedGeneration` must equal the object's `metadata.generation`, always.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionExpect {
    /// `GatewayClass`, `Gateway`, `ListenerSet`, `HTTPRoute` or `GRPCRoute`.
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// Its namespace (`default` unless given; ignored for a GatewayClass).
    #[serde(default)]
    pub namespace: Option<String>,
    /// For a Gateway or a ListenerSet: the listener whose conditions are meant (else the
    /// object's own).
    #[serde(default)]
    pub listener: Option<String>,
    /// For an HTTPRoute or GRPCRoute: the Gateway or ListenerSet (`parentRef.name`) whose parent
    /// status is meant.
    #[serde(default)]
    pub parent: Option<String>,
    /// For an HTTPRoute or GRPCRoute: the parent's `sectionName`, when the route names one.
    #[serde(default)]
    pub section: Option<String>,
    /// The condition type (`Accepted`, `ResolvedRefs`, `Programmed`...).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The reason, when it matters.
    #[serde(default)]
    pub reason: Option<String>,
    /// With `listener`: its `attachedRoutes`.
    #[serde(default)]
    pub attached_routes: Option<i64>,
    /// For a Gateway: its `attachedListenerSets` (unset counts as 0).
    #[serde(default)]
    pub attached_listener_sets: Option<i64>,
    /// Why weir is known to fail this check: a failure is reported as known, not failed; a pass
    /// is a failure (the case and docs/gateway-api.md need updating).
    #[serde(default)]
    pub known_failure: Option<String>,
}

/// What a step waits for after changing the manifests directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reload {
    /// A new routing table must be published (the step fails otherwise).
    #[default]
    Publish,
    /// Wait a fixed time, publish or not: for changes weir must reject, such as broken files.
    Settle,
}

/// One request and what must answer it.
///
/// Without `backend`, `any_of` or `distribution`, the answer must come from weir itself (its
/// body is not an echo description), as for a 404 without route or a 503 without endpoints.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The request method (`GET` by default).
    #[serde(default = "get")]
    pub method: String,
    /// The `Host` header (by default the address weir listens on).
    #[serde(default)]
    pub host: Option<String>,
    /// The request target: path and optional query (`/` by default).
    #[serde(default = "root")]
    pub path: String,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The expected status (200 by default).
    #[serde(default = "ok")]
    pub status: u16,
    /// The echo backend that must answer: a backend name (any of its replicas) or a replica name.
    #[serde(default)]
    pub backend: Option<String>,
    /// Backends or replicas one of which must answer.
    #[serde(default)]
    pub any_of: Vec<String>,
    /// Send the request several times: every listed backend or replica must answer at least
    /// once, and nothing else may answer.
    #[serde(default)]
    pub distribution: Option<Distribution>,
    /// Size of the request body to send, in bytes (with `Content-Length`; 0 by default).
    #[serde(default)]
    pub body_bytes: usize,
    /// Response headers that must be present with exactly these values (e.g. `location`).
    #[serde(default)]
    pub response_headers: BTreeMap<String, String>,
    /// Headers the answering echo backend must have received with exactly these values (e.g.
    /// `host`, `x-forwarded-prefix`); needs `backend` or `any_of`.
    #[serde(default)]
    pub upstream_headers: BTreeMap<String, String>,
    /// Response headers that must be absent.
    #[serde(default)]
    pub response_headers_absent: Vec<String>,
    /// Headers the answering echo backend must not have received; needs `backend` or `any_of`.
    #[serde(default)]
    pub upstream_headers_absent: Vec<String>,
    /// The path (and `?query`) the answering echo backend must have received, after rewrites;
    /// needs `backend` or `any_of`.
    #[serde(default)]
    pub upstream_path: Option<String>,
    /// A header every answering echo replica must have received with the name of its own
    /// backend as value (replica `v1-0` of backend `v1`: `v1`), whichever backend answered: a
    /// split whose shares each set their own header (`HTTPBackendRef.filters`). Needs
    /// `backend`, `any_of` or `distribution`.
    #[serde(default)]
    pub upstream_header_names_backend: Option<String>,
    /// Send the request byte for byte over a plain socket instead of through an HTTP client:
    /// `path` goes on the request line as written (`/\admin`, `/%zz` and other targets a
    /// client library would refuse or clean), with `Connection: close`.
    #[serde(default)]
    pub raw: bool,
    /// With `raw`: the request target in absolute form, `http://HOST/path`.
    #[serde(default)]
    pub absolute_form: bool,
    /// With `raw`: header lines sent verbatim after the others (e.g. a second `Host: x`).
    #[serde(default)]
    pub raw_headers: Vec<String>,
    /// Why weir is known to fail this check: a failure is reported as known, not failed; a pass
    /// is a failure (the case and docs/gateway-api.md need updating).
    #[serde(default)]
    pub known_failure: Option<String>,
    /// Send a unary gRPC call instead (a tonic client over h2c prior knowledge, `:authority`
    /// from `host`): `path` is `/{service}/{method}`, `headers` its metadata; the echo backend
    /// answers gRPC calls with its description. It must succeed (`status` 200, `grpc-status`
    /// 0) and come from `backend`, `any_of` or `distribution`.
    #[serde(default)]
    pub grpc: bool,
}

/// A load-balancing expectation.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Distribution {
    /// How many times to send the request.
    pub requests: u32,
    /// Backends or replicas each of which must answer at least once.
    pub backends: Vec<String>,
}

fn get() -> String {
    "GET".to_owned()
}

fn root() -> String {
    "/".to_owned()
}

fn ok() -> u16 {
    200
}

// === impl Scenario ===

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ScenarioError::Read { path: path.display().to_string(), source })?;
        Scenario::parse(&text, &path.display().to_string())
    }

    /// Parses and validates scenario text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario> {
        let scenario: Scenario = serde_saphyr::from_str(text)
            .map_err(|error| ScenarioError::Parse { path: origin.to_owned(), reason: error.to_string() })?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Whether a step writes Gateway API objects (their CRDs must then be installed on an API
    /// server before weir starts).
    pub fn uses_gateway_api(&self) -> bool {
        self.steps
            .iter()
            .flat_map(|s| s.files.values())
            .any(|text| text.contains("gateway.networking.k8s.io/"))
    }

    /// Replica names by backend: `a` → `[a-0, a-1]`.
    pub fn replicas(&self) -> BTreeMap<&str, Vec<String>> {
        self.backends
            .iter()
            .map(|(name, n)| (name.as_str(), (0..*n).map(|i| format!("{name}-{i}")).collect()))
            .collect()
    }

    /// The replica names a backend reference (a backend or a replica name) stands for.
    pub fn resolve(&self, reference: &str) -> Option<BTreeSet<String>> {
        let replicas = self.replicas();
        if let Some(names) = replicas.get(reference) {
            return Some(names.iter().cloned().collect());
        }
        replicas.values().flatten().find(|name| *name == reference).map(|name| BTreeSet::from([name.clone()]))
    }

    /// The label of step `index` (0-based) in messages: `2 (edit the ingress)`.
    pub fn step_label(&self, index: usize) -> String {
        match self.steps.get(index).and_then(|s| s.name.as_deref()) {
            Some(name) => format!("{} ({name})", index + 1),
            None => (index + 1).to_string(),
        }
    }

    fn validate(&self) -> Result<()> {
        let invalid = |at: String, reason: String| ScenarioError::Invalid { at, reason };
        let replicas = self.replicas();
        for (name, names) in &replicas {
            if names.is_empty() {
                return Err(invalid(format!("backend {name}"), "needs at least one replica".into()));
            }
            if name.is_empty() || name.contains(['{', '}', ':', ' ']) {
                return Err(invalid(format!("backend {name:?}"), "invalid name".into()));
            }
            if let Some(clash) = replicas.values().flatten().find(|r| *r == name) {
                return Err(invalid(format!("backend {name}"), format!("name clashes with replica {clash}")));
            }
        }
        if self.steps.is_empty() {
            return Err(invalid("scenario".into(), "has no steps".into()));
        }
        for (index, step) in self.steps.iter().enumerate() {
            let at = format!("step {}", self.step_label(index));
            for file in step.files.keys().chain(&step.delete) {
                if !is_plain_file_name(file) {
                    return Err(invalid(at, format!("{file:?} is not a plain file name")));
                }
            }
            for (i, expect) in step.expect.iter().enumerate() {
                let at = format!("{at}, expect[{i}] {}", expect.describe());
                self.validate_expect(expect).map_err(|reason| invalid(at, reason))?;
            }
            for (i, condition) in step.conditions.iter().enumerate() {
                let at = format!("{at}, conditions[{i}] {}", condition.describe());
                condition.validate().map_err(|reason| invalid(at, reason))?;
            }
            if step.manifests_only.as_deref().is_some_and(|why| why.trim().is_empty()) {
                return Err(invalid(at, "manifests_only needs a reason".into()));
            }
        }
        Ok(())
    }

    fn validate_expect(&self, expect: &Expect) -> Result<(), String> {
        let forms = usize::from(expect.backend.is_some())
            + usize::from(!expect.any_of.is_empty())
            + usize::from(expect.distribution.is_some());
        if forms > 1 {
            return Err("use only one of backend, any_of, distribution".into());
        }
        let references = expect
            .backend
            .iter()
            .chain(&expect.any_of)
            .chain(expect.distribution.iter().flat_map(|d| &d.backends));
        for reference in references {
            if self.resolve(reference).is_none() {
                return Err(format!("unknown backend or replica {reference:?}"));
            }
        }
        if let Some(distribution) = &expect.distribution {
            if distribution.backends.is_empty() {
                return Err("distribution.backends is empty".into());
            }
            let needed = distribution
                .backends
                .iter()
                .filter_map(|b| self.resolve(b))
                .map(|set| set.len())
                .sum::<usize>();
            if (distribution.requests as usize) < needed {
                return Err(format!(
                    "distribution.requests ({}) is fewer than the replicas that must answer ({needed})",
                    distribution.requests
                ));
            }
        }
        if expect.upstream_header_names_backend.is_some() && forms == 0 {
            return Err("upstream_header_names_backend needs backend, any_of or distribution".into());
        }
        if http::Method::from_bytes(expect.method.as_bytes()).is_err() {
            return Err(format!("invalid method {:?}", expect.method));
        }
        if expect.raw {
            let printable = |s: &str| s.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
            if !expect.path.starts_with('/') || !expect.path.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("invalid raw path {:?} (printable ASCII, no spaces)", expect.path));
            }
            if let Some(line) = expect.raw_headers.iter().find(|l| !printable(l) || !l.contains(':')) {
                return Err(format!("invalid raw header line {line:?}"));
            }
        } else if expect.absolute_form || !expect.raw_headers.is_empty() {
            return Err("absolute_form and raw_headers need raw: true".into());
        } else if !expect.path.starts_with('/') || expect.path.parse::<http::Uri>().is_err() {
            return Err(format!("invalid path {:?}", expect.path));
        }
        if expect.grpc {
            if expect.raw || expect.body_bytes > 0 || expect.method != "GET" {
                return Err("grpc: true takes no raw, body_bytes or method (a gRPC call is a POST)".into());
            }
            if expect.status != 200
                || (expect.backend.is_none() && expect.any_of.is_empty() && expect.distribution.is_none())
            {
                return Err(
                    "grpc: true checks successful calls: status 200 and backend, any_of or distribution"
                        .into(),
                );
            }
            if !expect.response_headers.is_empty() || !expect.response_headers_absent.is_empty() {
                return Err("grpc: true does not check response headers".into());
            }
        }
        if http::StatusCode::from_u16(expect.status).is_err() {
            return Err(format!("invalid status {}", expect.status));
        }
        for (name, value) in &expect.headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err()
                || http::HeaderValue::from_str(value).is_err()
            {
                return Err(format!("invalid header {name}: {value:?}"));
            }
        }
        let names = expect.response_headers.keys().chain(expect.upstream_headers.keys());
        for name in names.chain(&expect.response_headers_absent).chain(&expect.upstream_headers_absent) {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("invalid header name {name:?}"));
            }
        }
        if expect.known_failure.as_deref().is_some_and(|why| why.trim().is_empty()) {
            return Err("known_failure needs a reason".into());
        }
        let upstream = !expect.upstream_headers.is_empty()
            || !expect.upstream_headers_absent.is_empty()
            || expect.upstream_path.is_some();
        if upstream && expect.backend.is_none() && expect.any_of.is_empty() {
            return Err(
                "upstream_headers and upstream_path need backend or any_of (an echo must answer)".into()
            );
        }
        Ok(())
    }
}

// === impl ConditionExpect ===

impl ConditionExpect {
    /// The condition in messages: `HTTPRoute default/web parent edge: Accepted`.
    pub fn describe(&self) -> String {
        let mut out = match self.kind.as_str() {
            "GatewayClass" => format!("GatewayClass {}", self.name),
            kind => format!("{kind} {}/{}", self.namespace(), self.name),
        };
        if let Some(listener) = &self.listener {
            out.push_str(&format!(" listener {listener}"));
        }
        if let Some(parent) = &self.parent {
            out.push_str(&format!(" parent {parent}"));
            if let Some(section) = &self.section {
                out.push_str(&format!("/{section}"));
            }
        }
        out.push_str(&format!(": {}", self.type_));
        out
    }

    /// The namespace (`default` unless given).
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }

    fn validate(&self) -> Result<(), String> {
        match self.kind.as_str() {
            "GatewayClass" | "Gateway" | "ListenerSet" | "HTTPRoute" | "GRPCRoute" => {}
            other => {
                return Err(format!(
                    "unknown kind {other:?} (GatewayClass, Gateway, ListenerSet, HTTPRoute, GRPCRoute)"
                ));
            }
        }
        if self.listener.is_some() && !matches!(self.kind.as_str(), "Gateway" | "ListenerSet") {
            return Err("listener is for a Gateway or a ListenerSet".into());
        }
        if self.attached_listener_sets.is_some() && (self.kind != "Gateway" || self.listener.is_some()) {
            return Err("attached_listener_sets is for a Gateway's own status".into());
        }
        let route = matches!(self.kind.as_str(), "HTTPRoute" | "GRPCRoute");
        if (self.parent.is_some() || self.section.is_some()) != route {
            return Err("a route condition needs parent (and only routes take parent and section)".into());
        }
        if self.attached_routes.is_some() && self.listener.is_none() {
            return Err("attached_routes needs listener".into());
        }
        if !matches!(self.status.as_str(), "True" | "False" | "Unknown") {
            return Err(format!("status {:?} is not True, False or Unknown", self.status));
        }
        if self.known_failure.as_deref().is_some_and(|why| why.trim().is_empty()) {
            return Err("known_failure needs a reason".into());
        }
        Ok(())
    }
}

// === impl Expect ===

impl Expect {
    /// The request in messages: `GET http://a.example.com/foo`.
    pub fn describe(&self) -> String {
        let host = self.host.as_deref().unwrap_or("<weir address>");
        let method = if self.grpc { "gRPC" } else { self.method.as_str() };
        let mut out = format!("{method} http://{host}{}", self.path);
        for (name, value) in &self.headers {
            out.push_str(&format!(" [{name}: {value}]"));
        }
        if self.raw {
            out.push_str(if self.absolute_form { " (raw, absolute-form)" } else { " (raw)" });
        }
        for line in &self.raw_headers {
            out.push_str(&format!(" [{line}]"));
        }
        out
    }
}

/// A file name without directories, usable in the manifests directory.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\']) && !name.starts_with('.')
}

// === placeholders ===

/// Where the echo replicas listen, for placeholder substitution.
pub trait Addresses {
    /// The IP address of a replica (`{{ip:a-0}}`).
    fn ip(&self, replica: &str) -> Option<String>;
    /// The port shared by a backend's replicas (`{{port:a}}`).
    fn port(&self, backend: &str) -> Option<u16>;
}

/// Replaces `{{ip:REPLICA}}` and `{{port:BACKEND}}` in manifest text; any other `{{...}}` is an
/// error.
pub fn substitute(text: &str, addresses: &dyn Addresses) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unterminated placeholder at {:?}", truncate(&rest[start..])))?;
        let inner = after[..end].trim();
        let value = match inner.split_once(':').map(|(k, v)| (k.trim(), v.trim())) {
            Some(("ip", replica)) => {
                addresses.ip(replica).ok_or_else(|| format!("{{{{{inner}}}}}: no replica {replica:?}"))?
            }
            Some(("port", backend)) => addresses
                .port(backend)
                .ok_or_else(|| format!("{{{{{inner}}}}}: no backend {backend:?}"))?
                .to_string(),
            _ => {
                return Err(format!(
                    "unknown placeholder {{{{{inner}}}}} (expected {{{{ip:REPLICA}}}} or {{{{port:BACKEND}}}})"
                ));
            }
        };
        out.push_str(&value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn truncate(text: &str) -> &str {
    let end = text.char_indices().nth(30).map_or(text.len(), |(index, _)| index);
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl Addresses for Fixed {
        fn ip(&self, replica: &str) -> Option<String> {
            (replica == "a-0").then(|| "127.0.0.2".to_owned())
        }
        fn port(&self, backend: &str) -> Option<u16> {
            (backend == "a").then_some(4242)
        }
    }

    #[test]
    fn substitutes_placeholders() {
        let text = "addresses: [\"{{ip:a-0}}\"]\nport: {{ port:a }}\n";
        assert_eq!(substitute(text, &Fixed).as_deref(), Ok("addresses: [\"127.0.0.2\"]\nport: 4242\n"));
    }

    #[test]
    fn rejects_unknown_placeholders() {
        assert!(substitute("{{ip:b-0}}", &Fixed).is_err());
        assert!(substitute("{{name:a}}", &Fixed).is_err());
        assert!(substitute("{{ip:a-0", &Fixed).is_err());
    }

    #[test]
    fn validates_backend_references() {
        let text = r"
description: x
backends: {a: 2}
steps:
  - expect:
      - {path: /, backend: b}
";
        let error = Scenario::parse(text, "test").err().map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(|e| e.contains("unknown backend or replica \"b\"")),
            "{error:?}"
        );
    }

    #[test]
    fn resolves_backends_and_replicas() {
        let text = "description: x\nbackends: {a: 2}\nsteps: [{}]\n";
        let scenario = Scenario::parse(text, "test").map_err(|e| e.to_string());
        let Ok(scenario) = scenario else {
            panic!("{scenario:?}");
        };
        assert_eq!(scenario.resolve("a"), Some(BTreeSet::from(["a-0".to_owned(), "a-1".to_owned()])));
        assert_eq!(scenario.resolve("a-1"), Some(BTreeSet::from(["a-1".to_owned()])));
        assert_eq!(scenario.resolve("a-2"), None);
    }
}
