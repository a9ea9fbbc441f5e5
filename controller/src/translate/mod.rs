//! Translation of a snapshot of Kubernetes objects into the dataplane routing table (pure).
//!
//! [`translate`] runs processors in order over a [`Snapshot`]: class selection (which Ingresses
//! are ours), routes (hosts, paths, precedence, conflicts, default backends), backends (Service
//! ports to endpoints) and TLS. No I/O, no clocks; the output does not depend on the order objects
//! were added. Invalid objects become [`Warning`]s, never panics; the rest of the table builds.

pub mod annotations;
mod backend;
mod class;
mod headers;
mod incremental;
mod rank;
mod routes;
pub mod settings;
mod tls;
mod warnings;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use weir_dataplane::fast::HashMap;

use k8s_openapi::api::networking::v1::Ingress;
use serde::{Deserialize, Serialize};
use weir_dataplane::model::{
    Backend, BackendId, ClientAuth, Endpoint, HostMatch, ObjectRef, Passthrough, PathMatch, Route,
    RouteAction, RoutePolicy, RouteTable, ServicePort, Target, UpstreamProtocol, UpstreamTls, VirtualHost,
};

pub use incremental::{Translator, Update};
pub use warnings::{ObjectKind, Reason, Severity, Warning};

use crate::snapshot::Snapshot;
use backend::SliceIndex;
use class::{ClassSelector, LEGACY_CLASS_ANNOTATION, Selected};
use rank::Rank;
use warnings::Warnings;

/// What translation needs to know about this controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TranslateConfig {
    /// The class name served when no IngressClass object of that name exists.
    pub ingress_class: String,
    /// The `spec.controller` of IngressClasses that are ours.
    pub controller_name: String,
    /// Whether Ingresses naming no class at all are ours (without a default IngressClass).
    pub watch_ingress_without_class: bool,
    /// The Secret serving TLS names no Ingress covers (`--default-certificate`); none: the
    /// dataplane's self-signed certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_certificate: Option<ObjectRef>,
    /// The ConfigMap of global settings (`--configmap`); none: defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<ObjectRef>,
}

impl Default for TranslateConfig {
    fn default() -> Self {
        TranslateConfig {
            ingress_class: "weir".to_string(),
            controller_name: "weir.dev/ingress-controller".to_string(),
            watch_ingress_without_class: false,
            default_certificate: None,
            settings: None,
        }
    }
}

/// The result of a translation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Translation {
    /// The routing table to publish.
    pub table: RouteTable,
    /// Findings about the objects, sorted.
    pub warnings: Vec<Warning>,
    /// The Ingresses of our class, sorted (the status writer updates these).
    pub ingresses: Vec<ObjectRef>,
}

/// An Ingress of our class.
pub(crate) struct Ours<'a> {
    /// Its identity and precedence.
    pub(crate) rank: Rank,
    /// The object.
    pub(crate) ingress: &'a Ingress,
}

/// How one Ingress asks a backend to be spoken to: its rank, protocol, TLS settings and
/// whether it goes through the Service's ClusterIP (`service-upstream`).
type BackendUse<'a> = (&'a Rank, UpstreamProtocol, Option<UpstreamTls>, bool);

/// Translates a snapshot into a routing table and warnings.
pub fn translate(snapshot: &Snapshot, config: &TranslateConfig) -> Translation {
    let slices = SliceIndex::new(snapshot);
    let mut translation = translate_part(snapshot, snapshot.ingresses.iter(), &slices, config, None);
    if let Some(secret) = &config.default_certificate {
        let mut warnings = Warnings::default();
        if let Some(cert) = tls::default_certificate(secret, snapshot, &mut warnings) {
            translation.table.certificates.insert(secret.clone(), cert);
            translation.table.default_certificate = Some(secret.clone());
        }
        translation.warnings.extend(warnings.finish());
    }
    translation
}

/// Translates `ingresses` (some or all of the snapshot's), reading the rest of the snapshot
/// only by key. The default certificate is left to the caller. With `couplings`, each Ingress
/// of our class also reports what ties its translation to others' ([`incremental`]).
fn translate_part<'s>(
    snapshot: &'s Snapshot,
    ingresses: impl IntoIterator<Item = (&'s ObjectRef, &'s Ingress)>,
    slices: &SliceIndex,
    config: &TranslateConfig,
    mut couplings: Option<&mut Vec<(ObjectRef, incremental::Couplings)>>,
) -> Translation {
    let mut warnings = Warnings::default();
    // Global settings: the dataplane's, and the defaults of every route's policy.
    let settings = settings::read(snapshot, config, &mut warnings);

    // Class selection: Ingresses of other classes are ignored entirely.
    let selector = ClassSelector::new(&snapshot.ingress_classes, config);
    let ingresses = ingresses.into_iter();
    let mut ours = Vec::with_capacity(ingresses.size_hint().0);
    for (key, ingress) in ingresses {
        let Some(how) = selector.select(ingress) else { continue };
        if let Selected::LegacyAnnotation(class) = how {
            warnings.warn(
                key,
                Reason::DeprecatedClassAnnotation,
                format!(
                    "metadata.annotations[{LEGACY_CLASS_ANNOTATION}]: the annotation is deprecated; set spec.ingressClassName: {class} instead"
                ),
            );
        }
        ours.push(Ours { rank: Rank::of(key.clone(), ingress), ingress });
    }

    // Annotations: one typed policy per Ingress, applied to each of its routes.
    // `use-regex` and `rewrite-target` make every path of the Ingress's hosts a regex.
    let mut policies: HashMap<&ObjectRef, RoutePolicy> =
        HashMap::with_capacity_and_hasher(ours.len(), Default::default());
    let mut canary_specs = BTreeMap::new();
    let mut aliases = Vec::new();
    let mut www_redirects = Vec::new();
    let mut error_specs: BTreeMap<&ObjectRef, (Vec<u16>, Option<String>)> = BTreeMap::new();
    let mut regex_hosts = BTreeSet::new();
    for o in &ours {
        let parsed = annotations::parse(
            &o.rank.object,
            o.ingress.metadata.annotations.as_ref(),
            &annotations::Refs {
                secrets: &snapshot.secrets,
                config_maps: &snapshot.config_maps,
                allowed_response_headers: settings.allowed_response_headers.as_ref(),
            },
            &mut warnings,
        );
        if let Some(list) = couplings.as_deref_mut() {
            list.push((o.rank.object.clone(), incremental::Couplings::of(o, &parsed)));
        }
        if parsed.regex_paths {
            let rules = o.ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
            regex_hosts
                .extend(rules.iter().filter_map(|r| HostMatch::parse(r.host.as_deref().unwrap_or("")).ok()));
        }
        if let Some(spec) = parsed.canary {
            canary_specs.insert(&o.rank.object, spec);
        }
        if let Some(errors) = parsed.custom_errors {
            error_specs.insert(&o.rank.object, errors);
        }
        if !parsed.server_aliases.is_empty() {
            aliases.push((o.rank.clone(), o.ingress, parsed.server_aliases));
        }
        if parsed.from_to_www {
            www_redirects.push((o.rank.clone(), o.ingress));
        }
        let mut policy = parsed.policy;
        settings.routes.apply(&mut policy, parsed.global_auth);
        parsed.response.or(&settings.routes.response).apply(&mut policy);
        policies.insert(&o.rank.object, policy);
    }

    // Routes and default backend, from the main Ingresses; canary Ingresses (ingress-nginx
    // `canary: "true"`) only shadow the main routes with the same host and path.
    let (main, canaries): (Vec<Ours<'_>>, Vec<Ours<'_>>) = ours
        .iter()
        .map(|o| Ours { rank: o.rank.clone(), ingress: o.ingress })
        .partition(|o| !canary_specs.contains_key(&o.rank.object));
    let mut plan = routes::plan(&main, &regex_hosts, &mut warnings);
    // `server-alias`: more names serving the routes of the Ingress's first host; a name that is
    // a host of its own (or an older Ingress's alias) keeps its routes, and the alias is ignored.
    aliases.sort_by(|a, b| a.0.cmp(&b.0));
    for (rank, ingress, names) in aliases {
        let rules = ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
        let Some(host) = rules.iter().find_map(|r| HostMatch::parse(r.host.as_deref()?).ok()) else {
            continue;
        };
        let Some(routes) = plan.hosts.get(&host).cloned() else { continue };
        for alias in names {
            if plan.hosts.contains_key(&alias) {
                warnings.warn(
                    &rank.object,
                    Reason::ConflictLost,
                    format!(
                        "metadata.annotations[server-alias]: {} already has routes of its own (or is an older alias); the alias is ignored",
                        routes::describe_host(&alias)
                    ),
                );
                continue;
            }
            plan.hosts.insert(alias, routes.clone());
        }
    }
    // `from-to-www-redirect`: `www.` added to or removed from each of the Ingress's hosts names a
    // host that redirects every request to it, unless that name has routes of its own.
    let mut host_redirects: BTreeMap<HostMatch, String> = BTreeMap::new();
    www_redirects.sort_by(|a, b| a.0.cmp(&b.0));
    for (rank, ingress) in www_redirects {
        let rules = ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
        for host in rules.iter().filter_map(|r| HostMatch::parse(r.host.as_deref()?).ok()) {
            let HostMatch::Exact(name) = &host else { continue };
            let other = match name.strip_prefix("www.") {
                Some(bare) => bare.to_string(),
                None => format!("www.{name}"),
            };
            let Ok(other_host) = HostMatch::parse(&other) else { continue };
            let Some(routes) = plan.hosts.get(&host).cloned() else { continue };
            if plan.hosts.contains_key(&other_host) {
                if !host_redirects.contains_key(&other_host) {
                    warnings.warn(
                        &rank.object,
                        Reason::ConflictLost,
                        format!(
                            "metadata.annotations[from-to-www-redirect]: {} has routes of its own; it is not redirected to {}",
                            routes::describe_host(&other_host),
                            routes::describe_host(&host)
                        ),
                    );
                }
                continue;
            }
            plan.hosts.insert(other_host.clone(), routes);
            host_redirects.insert(other_host, name.clone());
        }
    }
    let canary_plan = routes::plan(&canaries, &regex_hosts, &mut warnings);
    if let Some(claim) = &canary_plan.default_backend {
        warnings.warn(
            &claim.rank.object,
            Reason::CanaryWithoutMain,
            "spec.defaultBackend: a canary Ingress's default backend is ignored".to_string(),
        );
    }
    for (host, paths) in &canary_plan.hosts {
        for (path, claim) in paths {
            if !plan.hosts.get(host).is_some_and(|main| main.contains_key(path)) {
                warnings.error(
                    &claim.rank.object,
                    Reason::CanaryWithoutMain,
                    format!(
                        "{}: no main Ingress serves {} on {}; the canary is ignored",
                        claim.field.claim(),
                        routes::describe_path(path),
                        routes::describe_host(host)
                    ),
                );
            }
        }
    }

    // TLS first: which hosts have it decides their routes' ssl-redirect.
    let tls = tls::plan(&ours, snapshot, &mut warnings);
    let ingresses: HashMap<&ObjectRef, &Ingress> = ours.iter().map(|o| (&o.rank.object, o.ingress)).collect();
    let mut redirects: HashMap<&ObjectRef, (bool, bool)> = HashMap::default();
    let coverage = tls::Coverage::new(&tls.entries);
    let mut ssl_redirect = |object: &ObjectRef, host: &HostMatch, warnings: &mut Warnings| {
        let Some((object, ingress)) = ingresses.get_key_value(object) else { return false };
        let (ssl, force) = *redirects.entry(object).or_insert_with(|| {
            (
                annotations::flag(
                    ingress,
                    object,
                    annotations::SSL_REDIRECT,
                    settings.routes.ssl_redirect,
                    warnings,
                ),
                annotations::flag(
                    ingress,
                    object,
                    annotations::FORCE_SSL_REDIRECT,
                    settings.routes.force_ssl_redirect,
                    warnings,
                ),
            )
        });
        force || (ssl && coverage.covers(host))
    };

    // Backends: only those a winning route or the default backend uses.
    // Each is resolved once; what is wrong with one is told to every claim that uses it.
    let resolver = backend::Resolver::new(snapshot, slices);
    let mut table = RouteTable::default();
    table.hosts.reserve(plan.hosts.len());
    let mut unusable: HashMap<BackendId, backend::Error> = HashMap::default();
    // (A hash map while building; the table's is sorted.) Sized for a backend per route, the
    // most there can be, so that it never grows by rehashing.
    let claims = plan.hosts.values().map(|paths| paths.len()).sum::<usize>() + 1;
    let mut backends: HashMap<BackendId, Backend> =
        HashMap::with_capacity_and_hasher(claims, Default::default());
    let mut resolve =
        |claim: &routes::Claim, warnings: &mut Warnings, backends: &mut HashMap<BackendId, Backend>| {
            if !backends.contains_key(&claim.backend) {
                let (backend, error) = resolver.resolve(&claim.backend);
                backends.insert(claim.backend.clone(), backend);
                if let Some(error) = error {
                    unusable.insert(claim.backend.clone(), error);
                }
            }
            if let Some(error) = unusable.get(&claim.backend) {
                let field = match error {
                    backend::Error::PortNotFound { .. } => "service.port",
                    _ => "service.name",
                };
                warnings.error(
                    &claim.rank.object,
                    error.reason(),
                    format!("{}.{field}: {error}; requests routed to it answer 503", claim.field.backend()),
                );
            }
        };
    for (host, paths) in &plan.hosts {
        let mut routes = Vec::with_capacity(paths.len());
        for (path, claim) in paths {
            resolve(claim, &mut warnings, &mut backends);
            let canary = canary_plan.hosts.get(host).and_then(|c| c.get(path)).and_then(|c| {
                let spec: &annotations::CanarySpec = canary_specs.get(&c.rank.object)?;
                resolve(c, &mut warnings, &mut backends);
                Some(spec.with_backend(c.backend.clone()))
            });
            // `custom-http-errors`: pages from the `default-backend` Service (its first port) or
            // the table's default backend.
            let custom_errors = error_specs.get(&claim.rank.object).and_then(|(codes, service)| {
                let backend = match service {
                    Some(name) => {
                        let ns = &claim.rank.object.namespace;
                        let port = snapshot
                            .services
                            .get(&ObjectRef::new(ns.as_str(), name.as_str()))
                            .and_then(|s| s.spec.as_ref()?.ports.as_ref()?.first().map(|p| p.port))
                            .and_then(|p| u16::try_from(p).ok())
                            .unwrap_or(80);
                        let id = BackendId {
                            namespace: ns.clone(),
                            service: name.clone(),
                            port: ServicePort::Number(port),
                        };
                        let pages = routes::Claim {
                            backend: id.clone(),
                            rank: claim.rank.clone(),
                            seq: 0,
                            field: routes::Field::DefaultBackendAnnotation,
                        };
                        resolve(&pages, &mut warnings, &mut backends);
                        id
                    }
                    None => match plan.default_backend.as_ref() {
                        Some(default) => default.backend.clone(),
                        None => {
                            warnings.warn(
                                &claim.rank.object,
                                Reason::InvalidAnnotation,
                                "metadata.annotations[custom-http-errors]: ignored: no default-backend annotation and no default backend to serve the pages".into(),
                            );
                            return None;
                        }
                    },
                };
                Some(weir_dataplane::model::CustomErrors { codes: codes.clone(), backend })
            });
            routes.push(Route {
                path: path.clone(),
                action: RouteAction::Forward(claim.backend.clone()),
                policy: RoutePolicy {
                    ssl_redirect: ssl_redirect(&claim.rank.object, host, &mut warnings),
                    canary: canary.map(Box::new),
                    custom_errors: custom_errors.map(Box::new),
                    host_redirect: host_redirects.get(host).cloned(),
                    ..route_policy(&policies, claim, path, &settings.routes)
                },
                origin: claim.rank.object.clone(),
            });
        }
        if routes.is_empty() {
            continue;
        }
        routes.sort_by(|a, b| routes::route_order(&a.path).cmp(&routes::route_order(&b.path)));
        table.hosts.push(VirtualHost { host: host.clone(), routes });
    }
    if let Some(claim) = &plan.default_backend {
        resolve(claim, &mut warnings, &mut backends);
        table.default_backend = Some(claim.backend.clone());
    }

    // Upstream protocols: a backend used by several Ingresses takes the `backend-protocol` of
    // the oldest one; the others are told when theirs differs.
    let mut users: HashMap<&BackendId, Vec<BackendUse<'_>>> =
        HashMap::with_capacity_and_hasher(backends.len(), Default::default());
    let attached = canary_plan.hosts.iter().flat_map(|(host, paths)| {
        paths
            .iter()
            .filter(|(path, _)| plan.hosts.get(host).is_some_and(|m| m.contains_key(*path)))
            .map(|(_, c)| c)
    });
    let claims = plan
        .hosts
        .values()
        .flat_map(|paths| paths.values())
        .chain(plan.default_backend.as_ref())
        .chain(attached);
    for claim in claims {
        let Some(ingress) = ingresses.get(&claim.rank.object) else { continue };
        let protocol = annotations::backend_protocol(ingress, &claim.rank.object, &mut warnings);
        let tls = protocol
            .is_tls()
            .then(|| annotations::upstream_tls(ingress, &claim.rank.object, snapshot, &mut warnings));
        let via_cluster_ip = annotations::flag(
            ingress,
            &claim.rank.object,
            annotations::SERVICE_UPSTREAM,
            false,
            &mut warnings,
        );
        users.entry(&claim.backend).or_default().push((&claim.rank, protocol, tls, via_cluster_ip));
    }
    for (id, mut list) in users {
        list.sort_by(|a, b| a.0.cmp(b.0));
        list.dedup_by(|a, b| a.0 == b.0);
        let (winner, protocol, tls, via_cluster_ip) = list[0].clone();
        for (loser, theirs, their_tls, their_via) in &list[1..] {
            let (annotation, message) = if *theirs != protocol {
                let message = format!(
                    "backend {id} is already spoken to as {} by {}; {} is not used",
                    annotations::protocol_name(protocol),
                    winner.explain_win(loser),
                    annotations::protocol_name(*theirs),
                );
                (annotations::BACKEND_PROTOCOL, message)
            } else if *their_tls != tls {
                let message = format!(
                    "backend {id} already uses the proxy-ssl-* settings of {}; this Ingress's are not used",
                    winner.explain_win(loser),
                );
                (annotations::BACKEND_PROTOCOL, message)
            } else if *their_via != via_cluster_ip {
                let message = format!(
                    "backend {id} is reached {} as {} says; this Ingress's service-upstream is not used",
                    if via_cluster_ip { "through its ClusterIP" } else { "at its endpoints" },
                    winner.explain_win(loser),
                );
                (annotations::SERVICE_UPSTREAM, message)
            } else {
                continue;
            };
            warnings.error(
                &loser.object,
                Reason::ConflictLost,
                format!("metadata.annotations[{annotation}]: {message}"),
            );
        }
        let cluster_ip = if via_cluster_ip {
            match resolver.cluster_ip(id) {
                Ok(addr) => addr,
                Err(why) => {
                    warnings.error(
                        &winner.object,
                        Reason::InvalidAnnotation,
                        format!(
                            "metadata.annotations[{}]: {why}; its endpoints are used",
                            annotations::SERVICE_UPSTREAM
                        ),
                    );
                    None
                }
            }
        } else {
            None
        };
        if let Some(backend) = backends.get_mut(id) {
            backend.protocol = protocol;
            backend.tls = tls;
            if let Some(addr) = cluster_ip {
                backend.target = Target::Endpoints(vec![Endpoint::new(addr)]);
            }
        }
    }
    table.backends = backends.into_iter().collect();

    // TLS passthrough: the hosts of an `ssl-passthrough` Ingress go, undecrypted, to the backend
    // of its `/` path (as in ingress-nginx, other paths do not matter for TLS connections).
    for ing in &ours {
        let object = &ing.rank.object;
        if !annotations::flag(ing.ingress, object, annotations::SSL_PASSTHROUGH, false, &mut warnings) {
            continue;
        }
        let rules = ing.ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
        let hosts: std::collections::BTreeSet<HostMatch> =
            rules.iter().filter_map(|r| HostMatch::parse(r.host.as_deref().unwrap_or("")).ok()).collect();
        for host in hosts {
            if host == HostMatch::Any {
                warnings.error(
                    object,
                    Reason::InvalidAnnotation,
                    format!("metadata.annotations[{}]: a rule without host cannot be passed through (SNI selects passthrough hosts); ignored for it", annotations::SSL_PASSTHROUGH),
                );
                continue;
            }
            let root = plan.hosts.get(&host).and_then(|paths| paths.get(&PathMatch::Prefix("/".to_string())));
            match root {
                Some(claim) if claim.rank.object == *object => {
                    table.passthrough.push(Passthrough { host, backend: claim.backend.clone() })
                }
                _ => warnings.error(
                    object,
                    Reason::InvalidAnnotation,
                    format!(
                        "metadata.annotations[{}]: {} has no path / of this Ingress to pass TLS connections to; not passed through",
                        annotations::SSL_PASSTHROUGH,
                        routes::describe_host(&host),
                    ),
                ),
            }
        }
    }
    // Client certificates (mTLS): per host of the Ingress's rules; for a host several
    // Ingresses protect, the oldest one's policy applies.
    let mut by_rank: Vec<&Ours<'_>> = ours.iter().collect();
    by_rank.sort_by(|a, b| a.rank.cmp(&b.rank));
    for ing in by_rank {
        let object = &ing.rank.object;
        let Some(policy) = annotations::client_auth(ing.ingress, object, snapshot, &mut warnings) else {
            continue;
        };
        let rules = ing.ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
        for rule in rules {
            let Ok(host) = HostMatch::parse(rule.host.as_deref().unwrap_or("")) else { continue };
            if host == HostMatch::Any {
                warnings.error(
                    object,
                    Reason::InvalidAnnotation,
                    format!("metadata.annotations[{}]: a rule without host cannot ask for client certificates (SNI selects the policy); ignored for it", annotations::AUTH_TLS_SECRET),
                );
                continue;
            }
            if table.client_auth.iter().any(|c| c.host == host) {
                continue;
            }
            table.client_auth.push(ClientAuth { host, ..policy.clone() });
        }
    }
    table.client_auth.sort_by(|a, b| a.host.cmp(&b.host));
    table.passthrough.sort_by(|a, b| a.host.cmp(&b.host));
    table.passthrough.dedup_by(|a, b| a.host == b.host);

    table.tls = tls.entries;
    table.certificates = tls.certificates;

    table.settings = settings.settings;
    Translation {
        table,
        warnings: warnings.finish(),
        ingresses: ours.into_iter().map(|o| o.rank.object).collect(),
    }
}

/// The policy of the route `claim` won on `path`: its Ingress's, less a rewrite where the path
/// is not a regex (an implicit `/` for a default backend), which has nothing to capture from.
fn route_policy(
    policies: &HashMap<&ObjectRef, RoutePolicy>,
    claim: &routes::Claim,
    path: &PathMatch,
    defaults: &settings::RouteDefaults,
) -> RoutePolicy {
    let mut policy = policies.get(&claim.rank.object).cloned().unwrap_or_default();
    // `no-auth-locations`: paths exempt from the global authentication.
    if defaults.exempt(&policy, path) {
        policy.external_auth = None;
    }
    if !matches!(path, PathMatch::Regex(_)) {
        policy.rewrite_target = None;
    }
    // An affinity cookie is scoped to the route's path unless the Ingress says otherwise.
    if let weir_dataplane::model::Balance::Cookie(cookie) = &mut policy.balance
        && cookie.path.is_empty()
    {
        cookie.path = match path {
            PathMatch::Exact(p) | PathMatch::Prefix(p) => p.clone(),
            PathMatch::Regex(_) => "/".to_string(),
        };
    }
    policy
}
