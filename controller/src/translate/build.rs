//! The processors of [`translate_part`](super::translate_part), over one [`Build`].
//!
//! Each processor reads what the earlier ones left in the build and adds its part; they run in
//! the order their dependencies give (settings are the defaults of every policy, annotations
//! decide which paths are regexes before routes are planned, TLS decides ssl-redirect before
//! routes are built, and so on). [`Build::finish`] hands the table and the findings over.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use weir_dataplane::fast::HashMap;
use weir_dataplane::model::{
    Backend, BackendId, ClientAuth, CustomErrors, Endpoint, HostMatch, HostTls, ObjectRef, Passthrough,
    PathMatch, Route, RouteAction, RoutePolicy, RouteTable, ServicePort, Target, UpstreamProtocol,
    UpstreamTls, VirtualHost,
};

use super::annotations::{self, CanarySpec};
use super::backend::{self, Resolver, SliceIndex};
use super::class::{ClassSelector, LEGACY_CLASS_ANNOTATION, Selected};
use super::rank::Rank;
use super::warnings::{Reason, Warnings};
use super::{Ours, TranslateConfig, Translation, incremental, routes, settings, tls};
use crate::snapshot::{Objects, Snapshot};

/// How one Ingress asks a backend to be spoken to: its rank, protocol, TLS settings and
/// whether it goes through the Service's ClusterIP (`service-upstream`).
type BackendUse<'a> = (&'a Rank, UpstreamProtocol, Option<UpstreamTls>, bool);

/// What translation has built so far: the cache the processors run over, in order.
pub(super) struct Build<'a> {
    /// The objects translated.
    snapshot: &'a Snapshot,
    /// This controller's configuration.
    config: &'a TranslateConfig,
    /// Findings so far.
    warnings: Warnings,
    /// The settings ConfigMap, typed.
    settings: settings::Parsed,
    /// The Ingresses of our class, in the order given.
    ours: Vec<Ours<'a>>,
    /// The same, by key.
    by_key: HashMap<&'a ObjectRef, &'a Ingress>,
    /// The route policy of each of our Ingresses (annotations over the settings' defaults).
    policies: HashMap<&'a ObjectRef, RoutePolicy>,
    /// The selection rules of each canary Ingress.
    canary_specs: BTreeMap<&'a ObjectRef, CanarySpec>,
    /// `server-alias` names, by Ingress.
    aliases: Vec<(Rank, &'a Ingress, Vec<HostMatch>)>,
    /// Ingresses asking for `from-to-www-redirect`.
    www_redirects: Vec<(Rank, &'a Ingress)>,
    /// `custom-http-errors` codes and the Service serving their pages, by Ingress.
    error_specs: BTreeMap<&'a ObjectRef, (Vec<u16>, Option<String>)>,
    /// Hosts whose every path is a regex (`use-regex`, `rewrite-target`).
    regex_hosts: BTreeSet<HostMatch>,
    /// The canary Ingresses of our class (the rest are main Ingresses).
    canaries: Vec<Ours<'a>>,
    /// The routes and default backend the main Ingresses won.
    plan: routes::Plan,
    /// Hosts that answer with a redirect to another (`from-to-www-redirect`), and that host.
    host_redirects: BTreeMap<HostMatch, String>,
    /// The routes the canary Ingresses won.
    canary_plan: routes::Plan,
    /// TLS entries and certificates.
    tls: tls::TlsPlan,
    /// The backends the table uses so far.
    backends: Backends<'a>,
    /// The table so far.
    table: RouteTable,
}

impl<'a> Build<'a> {
    /// An empty build over `snapshot`, whose EndpointSlices `slices` indexes.
    pub(super) fn new(snapshot: &'a Snapshot, slices: &'a SliceIndex, config: &'a TranslateConfig) -> Self {
        Build {
            snapshot,
            config,
            warnings: Warnings::default(),
            settings: settings::Parsed::default(),
            ours: Vec::new(),
            by_key: HashMap::default(),
            policies: HashMap::default(),
            canary_specs: BTreeMap::new(),
            aliases: Vec::new(),
            www_redirects: Vec::new(),
            error_specs: BTreeMap::new(),
            regex_hosts: BTreeSet::new(),
            canaries: Vec::new(),
            plan: routes::Plan::default(),
            host_redirects: BTreeMap::new(),
            canary_plan: routes::Plan::default(),
            tls: tls::TlsPlan::default(),
            backends: Backends {
                resolver: Resolver::new(snapshot, slices),
                resolved: HashMap::default(),
                unusable: HashMap::default(),
            },
            table: RouteTable::default(),
        }
    }

    /// Global settings: the dataplane's, and the defaults of every route's policy.
    pub(super) fn read_settings(&mut self) {
        self.settings = settings::read(self.snapshot, self.config, &mut self.warnings);
    }

    /// Class selection: keeps the Ingresses of our class; the others are ignored entirely.
    pub(super) fn select_ours<'s: 'a>(
        &mut self,
        ingresses: impl IntoIterator<Item = (&'s ObjectRef, &'s Ingress)>,
    ) {
        let selector = ClassSelector::new(&self.snapshot.ingress_classes, self.config);
        let ingresses = ingresses.into_iter();
        self.ours.reserve(ingresses.size_hint().0);
        for (key, ingress) in ingresses {
            let Some(how) = selector.select(ingress) else { continue };
            if let Selected::LegacyAnnotation(class) = how {
                self.warnings.warn(
                    key,
                    Reason::DeprecatedClassAnnotation,
                    format!(
                        "metadata.annotations[{LEGACY_CLASS_ANNOTATION}]: the annotation is deprecated; set spec.ingressClassName: {class} instead"
                    ),
                );
            }
            self.ours.push(Ours { rank: Rank::of(key.clone(), ingress), key, ingress });
        }
        self.by_key = self.ours.iter().map(|o| (o.key, o.ingress)).collect();
    }

    /// Annotations: one typed policy per Ingress, applied to each of its routes. `use-regex` and
    /// `rewrite-target` make every path of the Ingress's hosts a regex. With `couplings`, each
    /// Ingress also reports what ties its translation to others'.
    pub(super) fn parse_annotations(
        &mut self,
        mut couplings: Option<&mut Vec<(ObjectRef, incremental::Couplings)>>,
    ) {
        self.policies.reserve(self.ours.len());
        for o in &self.ours {
            let parsed = annotations::parse(
                &o.rank.object,
                o.ingress.metadata.annotations.as_ref(),
                &annotations::Refs {
                    secrets: &self.snapshot.secrets,
                    config_maps: &self.snapshot.config_maps,
                    allowed_response_headers: self.settings.allowed_response_headers.as_ref(),
                    guards: &self.settings.guards,
                },
                &mut self.warnings,
            );
            if let Some(list) = couplings.as_deref_mut() {
                list.push((
                    o.rank.object.clone(),
                    incremental::Couplings::of(o, &parsed, self.settings.routes.custom_errors.is_some()),
                ));
            }
            if parsed.regex_paths {
                let rules = o.ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
                self.regex_hosts.extend(
                    rules.iter().filter_map(|r| HostMatch::parse(r.host.as_deref().unwrap_or("")).ok()),
                );
            }
            if let Some(spec) = parsed.canary {
                self.canary_specs.insert(o.key, spec);
            }
            if let Some(errors) = parsed.custom_errors {
                self.error_specs.insert(o.key, errors);
            }
            if !parsed.server_aliases.is_empty() {
                self.aliases.push((o.rank.clone(), o.ingress, parsed.server_aliases));
            }
            if parsed.from_to_www {
                self.www_redirects.push((o.rank.clone(), o.ingress));
            }
            let balance_annotated = parsed.balance_annotated;
            let mut policy = parsed.policy;
            if let Some(auth) = policy.external_auth.as_deref_mut() {
                annotations::auth_tls::apply(
                    auth,
                    o.ingress,
                    &o.rank.object,
                    self.snapshot,
                    &self.settings.guards,
                    &mut self.warnings,
                );
            }
            self.settings.routes.apply(&mut policy, parsed.global_auth);
            if let Some((limit, window_ms, key, exempt)) = parsed.global_limit {
                match &self.settings.routes.memcached {
                    Some(memcached) => {
                        policy.global_rate_limit = Some(Box::new(weir_dataplane::model::GlobalRateLimit {
                            limit,
                            window_ms,
                            key,
                            exempt,
                            zone: o.rank.object.to_string(),
                            status: self.settings.routes.global_limit_status,
                            memcached: memcached.clone(),
                        }))
                    }
                    None => self.warnings.warn(
                        &o.rank.object,
                        Reason::InvalidAnnotation,
                        "metadata.annotations[nginx.ingress.kubernetes.io/global-rate-limit]: needs global-rate-limit-memcached-host in the ConfigMap; ignored".to_string(),
                    ),
                }
            }
            if !balance_annotated && let Some(balance) = &self.settings.routes.balance {
                policy.balance = balance.clone();
            }
            parsed.response.or(&self.settings.routes.response).apply(&mut policy);
            self.policies.insert(o.key, policy);
        }
    }

    /// Routes and default backend, from the main Ingresses; canary Ingresses (ingress-nginx
    /// `canary: "true"`) are set aside: they only shadow the main routes with the same host and
    /// path.
    pub(super) fn plan_routes(&mut self) {
        let (main, canaries): (Vec<Ours<'a>>, Vec<Ours<'a>>) =
            self.ours.iter().cloned().partition(|o| !self.canary_specs.contains_key(&o.rank.object));
        self.plan = routes::plan(&main, &self.regex_hosts, &self.settings.guards, &mut self.warnings);
        self.canaries = canaries;
    }

    /// `server-alias`: more names serving the routes of the Ingress's first host; a name that is
    /// a host of its own (or an older Ingress's alias) keeps its routes, and the alias is ignored.
    pub(super) fn add_server_aliases(&mut self) {
        let mut aliases = std::mem::take(&mut self.aliases);
        aliases.sort_by(|a, b| a.0.cmp(&b.0));
        for (rank, ingress, names) in aliases {
            let rules = ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
            let Some(host) = rules.iter().find_map(|r| HostMatch::parse(r.host.as_deref()?).ok()) else {
                continue;
            };
            let Some(routes) = self.plan.hosts.get(&host).cloned() else { continue };
            for alias in names {
                if self.plan.hosts.contains_key(&alias) {
                    self.warnings.warn(
                        &rank.object,
                        Reason::ConflictLost,
                        format!(
                            "metadata.annotations[server-alias]: {} already has routes of its own (or is an older alias); the alias is ignored",
                            routes::describe_host(&alias)
                        ),
                    );
                    continue;
                }
                self.plan.hosts.insert(alias, routes.clone());
            }
        }
    }

    /// `from-to-www-redirect`: `www.` added to or removed from each of the Ingress's hosts names
    /// a host that redirects every request to it, unless that name has routes of its own.
    pub(super) fn add_www_redirects(&mut self) {
        let mut www_redirects = std::mem::take(&mut self.www_redirects);
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
                let Some(routes) = self.plan.hosts.get(&host).cloned() else { continue };
                if self.plan.hosts.contains_key(&other_host) {
                    if !self.host_redirects.contains_key(&other_host) {
                        self.warnings.warn(
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
                self.plan.hosts.insert(other_host.clone(), routes);
                self.host_redirects.insert(other_host, name.clone());
            }
        }
    }

    /// Canary routes: those of the canary Ingresses that shadow a main route; the others, and a
    /// canary's default backend, are ignored with a warning.
    pub(super) fn plan_canaries(&mut self) {
        self.canary_plan =
            routes::plan(&self.canaries, &self.regex_hosts, &self.settings.guards, &mut self.warnings);
        if let Some(claim) = &self.canary_plan.default_backend {
            self.warnings.warn(
                &claim.rank.object,
                Reason::CanaryWithoutMain,
                "spec.defaultBackend: a canary Ingress's default backend is ignored".to_string(),
            );
        }
        for (host, paths) in &self.canary_plan.hosts {
            for (path, claim) in paths {
                if !self.plan.hosts.get(host).is_some_and(|main| main.contains_key(path)) {
                    self.warnings.error(
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
    }

    /// TLS, before the routes are built: which hosts have it decides their routes' ssl-redirect.
    pub(super) fn plan_tls(&mut self) {
        self.tls = tls::plan(&self.ours, self.snapshot, &mut self.warnings);
    }

    /// The table's hosts and default backend, from the winning claims; only the backends a
    /// winning route or the default backend uses are resolved, each once.
    pub(super) fn build_routes(&mut self) {
        if self.settings.routes.custom_errors.is_some()
            && self.plan.default_backend.is_none()
            && let Some(configmap) = &self.config.settings
        {
            self.warnings.warn_on(
                super::warnings::ObjectKind::ConfigMap,
                configmap,
                Reason::InvalidSetting,
                NO_DEFAULT_BACKEND_FOR_ERRORS.into(),
            );
        }
        let mut ssl_redirects = SslRedirects {
            ingresses: &self.by_key,
            coverage: tls::Coverage::new(&self.tls.entries),
            defaults: &self.settings.routes,
            read: HashMap::default(),
        };
        self.table.hosts.reserve(self.plan.hosts.len());
        // (A hash map while building; the table's is sorted.) Sized for a backend per route, the
        // most there can be, so that it never grows by rehashing.
        let claims = self.plan.hosts.values().map(|paths| paths.len()).sum::<usize>() + 1;
        self.backends.resolved.reserve(claims);
        for (host, paths) in &self.plan.hosts {
            let mut routes = Vec::with_capacity(paths.len());
            for (path, claim) in paths {
                self.backends.resolve(claim, &mut self.warnings);
                let canary = self.canary_plan.hosts.get(host).and_then(|c| c.get(path)).and_then(|c| {
                    let spec: &CanarySpec = self.canary_specs.get(&c.rank.object)?;
                    self.backends.resolve(c, &mut self.warnings);
                    Some(spec.with_backend(c.backend.clone()))
                });
                // The Ingress's own `custom-http-errors`, else the ConfigMap's (served by the
                // default backend; without one they do nothing, as the ConfigMap's warning says).
                let global_errors = self
                    .settings
                    .routes
                    .custom_errors
                    .as_ref()
                    .filter(|_| self.plan.default_backend.is_some())
                    .map(|codes| (codes.clone(), None));
                let spec = self.error_specs.get(&claim.rank.object).cloned().or(global_errors);
                let custom_errors = spec.as_ref().and_then(|spec| {
                    self.backends.error_pages(
                        claim,
                        spec,
                        &self.snapshot.services,
                        self.plan.default_backend.as_ref(),
                        &mut self.warnings,
                    )
                });
                routes.push(Route {
                    path: path.clone(),
                    action: RouteAction::Forward(claim.backend.clone()),
                    policy: RoutePolicy {
                        ssl_redirect: ssl_redirects.applies(&claim.rank.object, host, &mut self.warnings)
                            && !self.settings.routes.tls_redirect_exempt(path),
                        canary: canary.map(Box::new),
                        custom_errors: custom_errors.map(Box::new),
                        host_redirect: self.host_redirects.get(host).cloned(),
                        ..route_policy(&self.policies, claim, path, &self.settings.routes)
                    },
                    origin: claim.rank.object.clone(),
                    conditions: None,
                    rule: None,
                });
            }
            if routes.is_empty() {
                continue;
            }
            routes.sort_by(|a, b| routes::route_order(&a.path).cmp(&routes::route_order(&b.path)));
            self.table.hosts.push(VirtualHost { host: host.clone(), routes, fallback: Vec::new() });
        }
        if let Some(claim) = &self.plan.default_backend {
            self.backends.resolve(claim, &mut self.warnings);
            self.table.default_backend = Some(claim.backend.clone());
        }
    }

    /// Upstream protocols: a backend used by several Ingresses takes the `backend-protocol` (and
    /// `proxy-ssl-*`, `service-upstream`) of the oldest one; the others are told when theirs
    /// differs. The backends are then complete and go into the table.
    pub(super) fn settle_upstream_protocols(&mut self) {
        let users = backend_users(
            &self.plan,
            &self.canary_plan,
            &self.by_key,
            self.snapshot,
            &self.settings,
            self.backends.resolved.len(),
            &mut self.warnings,
        );
        for (id, mut list) in users {
            list.sort_by(|a, b| a.0.cmp(b.0));
            list.dedup_by(|a, b| a.0 == b.0);
            let (winner, protocol, tls, via_cluster_ip) = list[0].clone();
            for loser in &list[1..] {
                let Some((annotation, message)) = use_conflict(id, &list[0], loser) else { continue };
                self.warnings.error(
                    &loser.0.object,
                    Reason::ConflictLost,
                    format!("metadata.annotations[{annotation}]: {message}"),
                );
            }
            let cluster_ip = if via_cluster_ip {
                match self.backends.resolver.cluster_ip(id) {
                    Ok(addr) => addr,
                    Err(why) => {
                        self.warnings.error(
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
            if let Some(backend) = self.backends.resolved.get_mut(id) {
                backend.protocol = protocol;
                backend.tls = tls;
                if let Some(addr) = cluster_ip {
                    backend.target = Target::Endpoints(vec![Endpoint::new(addr)]);
                }
            }
        }
        self.table.backends = std::mem::take(&mut self.backends.resolved).into_iter().collect();
    }

    /// TLS passthrough: the hosts of an `ssl-passthrough` Ingress go, undecrypted, to the backend
    /// of its `/` path (as in ingress-nginx, other paths do not matter for TLS connections).
    pub(super) fn add_passthrough(&mut self) {
        for ing in &self.ours {
            let object = &ing.rank.object;
            if !annotations::flag(
                ing.ingress,
                object,
                annotations::SSL_PASSTHROUGH,
                false,
                &mut self.warnings,
            ) {
                continue;
            }
            let rules = ing.ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
            let hosts: BTreeSet<HostMatch> =
                rules.iter().filter_map(|r| HostMatch::parse(r.host.as_deref().unwrap_or("")).ok()).collect();
            for host in hosts {
                if host == HostMatch::Any {
                    self.warnings.error(
                        object,
                        Reason::InvalidAnnotation,
                        format!("metadata.annotations[{}]: a rule without host cannot be passed through (SNI selects passthrough hosts); ignored for it", annotations::SSL_PASSTHROUGH),
                    );
                    continue;
                }
                let root = self
                    .plan
                    .hosts
                    .get(&host)
                    .and_then(|paths| paths.get(&PathMatch::Prefix("/".to_string())));
                match root {
                    Some(claim) if claim.rank.object == *object => {
                        self.table.passthrough.push(Passthrough { host, backend: Some(claim.backend.clone()), split: Vec::new(), terminate: false, relay: false })
                    }
                    _ => self.warnings.error(
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
        self.table.passthrough.sort_by(|a, b| a.host.cmp(&b.host));
        self.table.passthrough.dedup_by(|a, b| a.host == b.host);
    }

    /// Client certificates (mTLS): per host of the Ingress's rules; for a host several Ingresses
    /// protect, the oldest one's policy applies.
    pub(super) fn add_client_auth(&mut self) {
        let mut by_rank: Vec<&Ours<'_>> = self.ours.iter().collect();
        by_rank.sort_by(|a, b| a.rank.cmp(&b.rank));
        for ing in by_rank {
            let object = &ing.rank.object;
            let Some(policy) = annotations::client_auth(
                ing.ingress,
                object,
                self.snapshot,
                &self.settings.guards,
                &mut self.warnings,
            ) else {
                continue;
            };
            let rules = ing.ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
            for rule in rules {
                let Ok(host) = HostMatch::parse(rule.host.as_deref().unwrap_or("")) else { continue };
                if host == HostMatch::Any {
                    self.warnings.error(
                        object,
                        Reason::InvalidAnnotation,
                        format!("metadata.annotations[{}]: a rule without host cannot ask for client certificates (SNI selects the policy); ignored for it", annotations::AUTH_TLS_SECRET),
                    );
                    continue;
                }
                if self.table.client_auth.iter().any(|c| c.host == host) {
                    continue;
                }
                self.table.client_auth.push(ClientAuth { host, ..policy.clone() });
            }
        }
        self.table.client_auth.sort_by(|a, b| a.host.cmp(&b.host));
    }

    /// Handshake options of single hosts (`ssl-ciphers`, `ssl-prefer-server-ciphers`): per host
    /// of the Ingress's rules; for a host several Ingresses set them on, the oldest one's
    /// apply, and the others are told so.
    pub(super) fn add_host_tls(&mut self) {
        let mut by_rank: Vec<&Ours<'_>> = self.ours.iter().collect();
        by_rank.sort_by(|a, b| a.rank.cmp(&b.rank));
        let mut owners: Vec<(HostMatch, &ObjectRef)> = Vec::new();
        for ing in by_rank {
            let object = &ing.rank.object;
            let Some(options) = annotations::host_tls(ing.ingress, object, &mut self.warnings) else {
                continue;
            };
            let key = match options.ciphers {
                Some(_) => annotations::SSL_CIPHERS,
                None => annotations::SSL_PREFER_SERVER_CIPHERS,
            };
            let rules = ing.ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
            for rule in rules {
                let Ok(host) = HostMatch::parse(rule.host.as_deref().unwrap_or("")) else { continue };
                if host == HostMatch::Any {
                    self.warnings.warn(
                        object,
                        Reason::InvalidAnnotation,
                        format!("metadata.annotations[{key}]: a rule without host has no TLS server name to choose the options by; the ConfigMap's apply to it"),
                    );
                    continue;
                }
                if let Some((_, owner)) = owners.iter().find(|(h, _)| *h == host) {
                    if *owner != object {
                        self.warnings.warn(
                            object,
                            Reason::ConflictLost,
                            format!("metadata.annotations[{key}]: the TLS options of {} come from the older Ingress {owner}; this Ingress's are not applied to it", routes::describe_host(&host)),
                        );
                    }
                    continue;
                }
                owners.push((host.clone(), object));
                self.table.host_tls.push(HostTls { host, ..options.clone() });
            }
        }
        self.table.host_tls.sort_by(|a, b| a.host.cmp(&b.host));
    }

    /// The translation: the table with its TLS entries, certificates and settings, the findings
    /// sorted, and our Ingresses.
    pub(super) fn finish(self) -> Translation {
        let Build { mut table, tls, settings, warnings, ours, .. } = self;
        table.tls = tls.entries;
        table.certificates = tls.certificates;
        table.settings = settings.settings;
        Translation {
            table,
            warnings: warnings.finish(),
            ingresses: ours.into_iter().map(|o| o.rank.object).collect(),
            gateway: None,
        }
    }
}

// === impl Backends ===

/// The backends the table uses, each resolved once; what is wrong with one is told to every
/// claim that uses it.
struct Backends<'a> {
    /// Resolves a backend against the snapshot.
    resolver: Resolver<'a>,
    /// Every backend resolved so far (a hash map while building; the table's is sorted).
    resolved: HashMap<BackendId, Backend>,
    /// Why a resolved backend cannot serve, when it cannot.
    unusable: HashMap<BackendId, backend::Error>,
}

impl Backends<'_> {
    /// Resolves the backend of `claim` (once), and tells its Ingress when the backend cannot
    /// serve.
    fn resolve(&mut self, claim: &routes::Claim, warnings: &mut Warnings) {
        if !self.resolved.contains_key(&claim.backend) {
            let (backend, error) = self.resolver.resolve(&claim.backend);
            self.resolved.insert(claim.backend.clone(), backend);
            if let Some(error) = error {
                self.unusable.insert(claim.backend.clone(), error);
            }
        }
        if let Some(error) = self.unusable.get(&claim.backend) {
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
    }

    /// `custom-http-errors` of `claim`'s route: pages from the `default-backend` Service (its
    /// first port), resolved here, or else from the table's default backend.
    fn error_pages(
        &mut self,
        claim: &routes::Claim,
        (codes, service): &(Vec<u16>, Option<String>),
        services: &Objects<Service>,
        default_backend: Option<&routes::Claim>,
        warnings: &mut Warnings,
    ) -> Option<CustomErrors> {
        let backend = match service {
            Some(name) => {
                let ns = &claim.rank.object.namespace;
                let port = services
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
                self.resolve(&pages, warnings);
                id
            }
            None => match default_backend {
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
        Some(CustomErrors { codes: codes.clone(), backend })
    }
}

// === impl SslRedirects ===

/// Whether a route redirects plain HTTP to HTTPS: its Ingress's `force-ssl-redirect`, or its
/// `ssl-redirect` where the host has TLS. Each Ingress's annotations are read once.
struct SslRedirects<'b, 'a> {
    /// Our Ingresses by key.
    ingresses: &'b HashMap<&'a ObjectRef, &'a Ingress>,
    /// The hosts that have TLS.
    coverage: tls::Coverage<'b>,
    /// The settings' defaults of both annotations.
    defaults: &'b settings::RouteDefaults,
    /// `ssl-redirect` and `force-ssl-redirect` of the Ingresses read so far.
    read: HashMap<&'a ObjectRef, (bool, bool)>,
}

impl SslRedirects<'_, '_> {
    /// Whether the route of Ingress `object` on `host` redirects to HTTPS.
    fn applies(&mut self, object: &ObjectRef, host: &HostMatch, warnings: &mut Warnings) -> bool {
        let Some((&object, &ingress)) = self.ingresses.get_key_value(object) else { return false };
        let defaults = self.defaults;
        let (ssl, force) = *self.read.entry(object).or_insert_with(|| {
            (
                annotations::flag(
                    ingress,
                    object,
                    annotations::SSL_REDIRECT,
                    defaults.ssl_redirect,
                    warnings,
                ),
                annotations::flag(
                    ingress,
                    object,
                    annotations::FORCE_SSL_REDIRECT,
                    defaults.force_ssl_redirect,
                    warnings,
                ),
            )
        });
        force || (ssl && self.coverage.covers(host))
    }
}

// === helpers ===

/// Who uses each backend and how: the claims of the winning routes, of the default backend and
/// of the canaries that shadow a main route, each with its Ingress's upstream annotations.
fn backend_users<'p>(
    plan: &'p routes::Plan,
    canary_plan: &'p routes::Plan,
    ingresses: &HashMap<&ObjectRef, &Ingress>,
    snapshot: &Snapshot,
    settings: &settings::Parsed,
    capacity: usize,
    warnings: &mut Warnings,
) -> HashMap<&'p BackendId, Vec<BackendUse<'p>>> {
    let mut users: HashMap<&BackendId, Vec<BackendUse<'_>>> =
        HashMap::with_capacity_and_hasher(capacity, Default::default());
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
        let protocol = annotations::backend_protocol(ingress, &claim.rank.object, warnings);
        let tls = protocol.is_tls().then(|| {
            annotations::upstream_tls(ingress, &claim.rank.object, snapshot, &settings.guards, warnings)
        });
        // The ConfigMap's `service-upstream` is the default of Ingresses without the annotation.
        let default = settings.routes.service_upstream;
        let via_cluster_ip =
            annotations::flag(ingress, &claim.rank.object, annotations::SERVICE_UPSTREAM, default, warnings);
        users.entry(&claim.backend).or_default().push((&claim.rank, protocol, tls, via_cluster_ip));
    }
    users
}

/// What to tell `loser`, which uses backend `id` otherwise than `winner` (the oldest user)
/// does: the annotation not used, and why; `None` when both use it alike.
fn use_conflict(
    id: &BackendId,
    (winner, protocol, tls, via_cluster_ip): &BackendUse<'_>,
    (loser, theirs, their_tls, their_via): &BackendUse<'_>,
) -> Option<(&'static str, String)> {
    Some(if theirs != protocol {
        let message = format!(
            "backend {id} is already spoken to as {} by {}; {} is not used",
            annotations::protocol_name(*protocol),
            winner.explain_win(loser),
            annotations::protocol_name(*theirs),
        );
        (annotations::BACKEND_PROTOCOL, message)
    } else if their_tls != tls {
        let message = format!(
            "backend {id} already uses the proxy-ssl-* settings of {}; this Ingress's are not used",
            winner.explain_win(loser),
        );
        (annotations::BACKEND_PROTOCOL, message)
    } else if their_via != via_cluster_ip {
        let message = format!(
            "backend {id} is reached {} as {} says; this Ingress's service-upstream is not used",
            if *via_cluster_ip { "through its ClusterIP" } else { "at its endpoints" },
            winner.explain_win(loser),
        );
        (annotations::SERVICE_UPSTREAM, message)
    } else {
        return None;
    })
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

/// The settings warning when `custom-http-errors` has no default backend to serve its pages.
pub(super) const NO_DEFAULT_BACKEND_FOR_ERRORS: &str = "data[custom-http-errors]: ignored: no default backend serves the pages (--default-backend-service, or an Ingress's defaultBackend)";
