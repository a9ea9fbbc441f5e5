//! The route processor: hosts, paths, precedence and conflicts, default backends.
//!
//! Every claim (host + path → backend) of every Ingress is collected first; then each
//! (host, path) goes to its oldest claimant and every other claimant is told who won. Nothing is
//! dropped silently.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::networking::v1::IngressBackend;
use weir_dataplane::model::{BackendId, HostMatch, PathMatch, ServicePort};

use super::Ours;
use super::rank::Rank;
use super::warnings::{Reason, Warnings};

/// One Ingress's claim on a route or on the default backend.
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    /// Where the backend goes.
    pub(crate) backend: BackendId,
    /// Who claims it.
    pub(crate) rank: Rank,
    /// Order of the claim within its Ingress (earlier entries win ties within one Ingress).
    pub(crate) seq: usize,
    /// The claiming field.
    pub(crate) field: Field,
}

/// Where a claim is written in its Ingress (spelled out only for messages).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Field {
    /// `spec.rules[rule].http.paths[path]`.
    Path {
        /// Index of the rule.
        rule: usize,
        /// Index of the path in the rule.
        path: usize,
    },
    /// `spec.defaultBackend`.
    DefaultBackend,
    /// The `default-backend` annotation (custom error pages).
    DefaultBackendAnnotation,
}

impl Field {
    /// The claiming field, e.g. `spec.rules[0].http.paths[1]`.
    pub(crate) fn claim(self) -> String {
        match self {
            Field::Path { rule, path } => format!("spec.rules[{rule}].http.paths[{path}]"),
            Field::DefaultBackend => "spec.defaultBackend".to_string(),
            Field::DefaultBackendAnnotation => "metadata.annotations[default-backend]".to_string(),
        }
    }

    /// The backend's field, e.g. `spec.rules[0].http.paths[1].backend`.
    pub(crate) fn backend(self) -> String {
        match self {
            Field::Path { .. } => format!("{}.backend", self.claim()),
            _ => self.claim(),
        }
    }
}

impl Claim {
    fn order(&self) -> (&Rank, usize) {
        (&self.rank, self.seq)
    }
}

/// The routes and default backend that won.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Winning routes by host and path (a `BTreeMap` keeps hosts in the table's order).
    pub(crate) hosts: BTreeMap<HostMatch, BTreeMap<PathMatch, Claim>>,
    /// The winning default backend.
    pub(crate) default_backend: Option<Claim>,
}

/// Builds the plan from our Ingresses, warning about every rejected part. Every path on a host
/// of `regex_hosts` is a case-insensitive regex (ingress-nginx's `use-regex` rule).
pub(crate) fn plan(
    ours: &[Ours<'_>],
    regex_hosts: &BTreeSet<HostMatch>,
    guards: &super::annotations::risk::Guards,
    warnings: &mut Warnings,
) -> Plan {
    let mut explicit: BTreeMap<HostMatch, BTreeMap<PathMatch, Vec<Claim>>> = BTreeMap::new();
    let mut implicit: BTreeMap<HostMatch, Vec<Claim>> = BTreeMap::new();
    let mut defaults: Vec<Claim> = Vec::new();

    for ing in ours {
        let Some(spec) = ing.ingress.spec.as_ref() else { continue };
        let ns = ing.rank.object.namespace.as_str();
        let rules = spec.rules.as_deref().unwrap_or_default();
        let default = spec.default_backend.as_ref().and_then(|b| {
            backend_id(ns, b, Field::DefaultBackend)
                .map_err(|(reason, msg)| {
                    warnings.error(&ing.rank.object, reason, format!("{msg}; the default backend is ignored"))
                })
                .ok()
        });
        let mut hosts = BTreeSet::new();
        let mut seq = 0usize;
        for (i, rule) in rules.iter().enumerate() {
            let host = match HostMatch::parse(rule.host.as_deref().unwrap_or("")) {
                Ok(host) => host,
                Err(err) => {
                    warnings.error(
                        &ing.rank.object,
                        Reason::InvalidHost,
                        format!("spec.rules[{i}].host: {err}; the rule is ignored"),
                    );
                    continue;
                }
            };
            if default.is_some() {
                hosts.insert(host.clone());
            }
            let paths = rule.http.as_ref().map(|h| h.paths.as_slice()).unwrap_or_default();
            let regex = regex_hosts.contains(&host);
            let mut claims = Vec::new();
            for (j, path) in paths.iter().enumerate() {
                let field = Field::Path { rule: i, path: j };
                let path_match = match path_match(path.path.as_deref(), &path.path_type, regex) {
                    Ok(m) => m,
                    Err(msg) => {
                        warnings.error(
                            &ing.rank.object,
                            Reason::InvalidPath,
                            format!("{}: {msg}; the path is ignored", field.claim()),
                        );
                        continue;
                    }
                };
                if let Some(why) = guards.path_refusal(path.path.as_deref().unwrap_or(""), &path.path_type) {
                    warnings.error(
                        &ing.rank.object,
                        Reason::InvalidPath,
                        format!("{}: {why}; the path is ignored", field.claim()),
                    );
                    continue;
                }
                let backend = match backend_id(ns, &path.backend, field) {
                    Ok(b) => b,
                    Err((reason, msg)) => {
                        warnings.error(&ing.rank.object, reason, format!("{msg}; the path is ignored"));
                        continue;
                    }
                };
                seq += 1;
                claims.push((path_match, Claim { backend, rank: ing.rank.clone(), seq, field }));
            }
            if !claims.is_empty() {
                let host_paths = explicit.entry(host).or_default();
                for (path, claim) in claims {
                    host_paths.entry(path).or_default().push(claim);
                }
            }
        }
        let Some(default) = default else { continue };
        let claim = |seq| Claim {
            backend: default.clone(),
            rank: ing.rank.clone(),
            seq,
            field: Field::DefaultBackend,
        };
        if rules.is_empty() {
            defaults.push(claim(0));
        } else {
            for host in hosts {
                seq += 1;
                implicit.entry(host).or_default().push(claim(seq));
            }
        }
    }

    let hosts = explicit
        .into_iter()
        .map(|(host, paths)| {
            let winners = paths
                .into_iter()
                .filter_map(|(path, claims)| {
                    let winner = pick(claims, warnings, |loser, winner| {
                        format!(
                            "{}: {} on {} is already served by {}; this path is ignored",
                            loser.field.claim(),
                            describe_path(&path),
                            describe_host(&host),
                            winner.rank.explain_win(&loser.rank),
                        )
                    })?;
                    Some((path, winner))
                })
                .collect();
            (host, winners)
        })
        .collect();
    let mut plan = Plan { hosts, default_backend: None };
    let root = PathMatch::Prefix("/".to_string());
    for (host, claims) in implicit {
        let routes = plan.hosts.entry(host.clone()).or_default();
        if routes.contains_key(&root) {
            continue; // an explicit `/` route serves the host's unmatched paths
        }
        if let Some(winner) = pick(claims, warnings, |loser, winner| {
            format!(
                "spec.defaultBackend: the implicit Prefix path \"/\" on {} is already served by the defaultBackend of {}; it is not added",
                describe_host(&host),
                winner.rank.explain_win(&loser.rank),
            )
        }) {
            routes.insert(root.clone(), winner);
        }
    }
    plan.default_backend = pick(defaults, warnings, |loser, winner| {
        format!(
            "spec.defaultBackend: the default backend is already set by {}; this one is ignored",
            winner.rank.explain_win(&loser.rank)
        )
    });
    plan
}

/// The oldest claim; every other claim gets a `ConflictLost` error.
fn pick(
    mut claims: Vec<Claim>,
    warnings: &mut Warnings,
    message: impl Fn(&Claim, &Claim) -> String,
) -> Option<Claim> {
    claims.sort_by(|a, b| a.order().cmp(&b.order()));
    let mut claims = claims.into_iter();
    let winner = claims.next()?;
    for loser in claims {
        warnings.error(&loser.rank.object, Reason::ConflictLost, message(&loser, &winner));
    }
    Some(winner)
}

/// The backend an Ingress names at `field`: its Service and port, exactly as written.
pub(crate) fn backend_id(
    namespace: &str,
    backend: &IngressBackend,
    field: Field,
) -> Result<BackendId, (Reason, String)> {
    let field = || field.backend();
    if let Some(resource) = &backend.resource {
        let group = resource.api_group.as_deref().map(|g| format!("{g}/")).unwrap_or_default();
        return Err((
            Reason::UnsupportedBackend,
            format!(
                "{}.resource: resource backends ({group}{} {}) are not supported, only Service backends",
                field(),
                resource.kind,
                resource.name
            ),
        ));
    }
    let Some(service) = &backend.service else {
        return Err((Reason::InvalidBackend, format!("{}: names neither a service nor a resource", field())));
    };
    if service.name.is_empty() {
        return Err((Reason::InvalidBackend, format!("{}.service.name: empty", field())));
    }
    let port = service.port.as_ref();
    let port = match (port.and_then(|p| p.number), port.and_then(|p| p.name.as_deref())) {
        (Some(n), _) => match u16::try_from(n) {
            Ok(n) if n != 0 => ServicePort::Number(n),
            _ => {
                return Err((
                    Reason::InvalidBackend,
                    format!("{}.service.port.number: {n} is not a port number (1-65535)", field()),
                ));
            }
        },
        (None, Some(name)) if !name.is_empty() => ServicePort::Name(name.to_string()),
        _ => {
            return Err((
                Reason::InvalidBackend,
                format!("{}.service.port: needs a number or a name", field()),
            ));
        }
    };
    Ok(BackendId { namespace: namespace.to_string(), service: service.name.clone(), port })
}

/// The path match of an Ingress path. `ImplementationSpecific` is a prefix match, unless
/// `regex`: then every path type is a case-insensitive regex anchored at the start, as
/// ingress-nginx's `~* "^path"` locations (RE2 syntax: no look-around, no back-references).
pub(crate) fn path_match(path: Option<&str>, path_type: &str, regex: bool) -> Result<PathMatch, String> {
    let path = path.unwrap_or("");
    if regex && matches!(path_type, "Exact" | "Prefix" | "ImplementationSpecific") {
        let path = if path.is_empty() { "/" } else { path };
        if !path.starts_with('/') {
            return Err(format!("path {path:?} does not start with \"/\""));
        }
        if let Some(c) = path.chars().find(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("path {path:?} contains {c:?}, which cannot appear in a request path"));
        }
        let pattern = format!("(?i){path}");
        return match weir_dataplane::route::router::compile_path_regex(&pattern) {
            Ok(_) => Ok(PathMatch::Regex(pattern)),
            Err(e) => Err(format!(
                "path {path:?} is not a valid regular expression (RE2 syntax: no look-around or back-references): {}",
                e.to_string().lines().last().unwrap_or_default()
            )),
        };
    }
    match path_type {
        "Exact" => {
            if path.is_empty() {
                return Err("pathType Exact needs a path".to_string());
            }
            check_path(path)?;
            Ok(PathMatch::Exact(path.to_string()))
        }
        "Prefix" | "ImplementationSpecific" => {
            if path.is_empty() {
                return Ok(PathMatch::Prefix("/".to_string()));
            }
            check_path(path)?;
            let trimmed = path.trim_end_matches('/');
            Ok(PathMatch::Prefix(if trimmed.is_empty() { "/".to_string() } else { trimmed.to_string() }))
        }
        "" => Err("pathType is missing (Exact, Prefix or ImplementationSpecific)".to_string()),
        other => Err(format!("pathType {other:?} is not one of Exact, Prefix, ImplementationSpecific")),
    }
}

fn check_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("path {path:?} does not start with \"/\""));
    }
    if let Some(c) = path.chars().find(|c| c.is_whitespace() || c.is_control() || *c == '?' || *c == '#') {
        return Err(format!("path {path:?} contains {c:?}, which cannot appear in a request path"));
    }
    Ok(())
}

/// `Prefix path "/api"`.
pub(crate) fn describe_path(path: &PathMatch) -> String {
    match path {
        PathMatch::Exact(p) => format!("Exact path {p:?}"),
        PathMatch::Prefix(p) => format!("Prefix path {p:?}"),
        PathMatch::Regex(p) => format!("regex path {p:?}"),
    }
}

/// `host "example.com"`, or `any host`.
pub(crate) fn describe_host(host: &HostMatch) -> String {
    match host {
        HostMatch::Any => "any host".to_string(),
        other => format!("host \"{other}\""),
    }
}

/// Sort key for routes within a host: Exact first, then Prefix by length (longest first), then
/// regexes; ties by path.
pub(crate) fn route_order(path: &PathMatch) -> (u8, std::cmp::Reverse<usize>, &str) {
    match path {
        PathMatch::Exact(p) => (0, std::cmp::Reverse(0), p),
        PathMatch::Prefix(p) => (1, std::cmp::Reverse(p.len()), p),
        PathMatch::Regex(p) => (2, std::cmp::Reverse(0), p),
    }
}
