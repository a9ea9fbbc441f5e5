//! Incremental translation: [`Translator`] keeps the last [`Translation`] and, when a few
//! objects change, translates again only the Ingresses whose output can differ, with the same
//! [`translate_part`](super::translate_part) that translates everything. The result is always
//! the one [`translate`](super::translate) gives for the whole snapshot (the tests check it
//! over the golden fixtures and random edits).
//!
//! ## Which Ingresses
//! The translation of one Ingress depends on others only through what they share
//! ([`Couplings`]): a host (route conflicts, default `/` routes, regex paths, aliases, canaries,
//! TLS entries, passthrough, client certificates), a Service (one backend, one protocol), the
//! table's default backend, and a wildcard TLS host that covers another Ingress's host (its
//! routes redirect to HTTPS). The changed Ingresses, and those that use a changed Service,
//! EndpointSlice, Endpoints or Secret, are closed over these ties (with the ties of both their
//! old and new versions): that group is translated again, and its part of the table replaced.
//! Every host, backend, TLS host and warning of the table belongs to exactly one such group,
//! which is what makes the replacement exact.
//!
//! IngressClasses and the configuration decide which Ingresses are ours at all, and the
//! settings ConfigMap (with the ConfigMaps its `add-headers` and `proxy-set-headers` name) sets
//! defaults of every route and the table's settings: a change to any of them translates
//! everything. Another ConfigMap can only be named by an annotation (`custom-headers`): the
//! Ingresses with an annotation naming it are translated again, like those naming a Secret.
//! `from-to-www-redirect` ties an Ingress to the other name of each of its hosts, and
//! `service-upstream` needs no tie of its own: the ClusterIP is the Service's, which ties the
//! Ingress already.

use std::collections::{BTreeMap, BTreeSet};

use weir_dataplane::fast::{HashMap, HashSet};

use weir_dataplane::model::changes::TableChanges;
use weir_dataplane::model::{
    Backend, BackendId, Certificate, HostMatch, ObjectRef, ServicePort, TlsEntry, VirtualHost,
};

use super::annotations::Parsed;
use super::backend::SliceIndex;
use super::warnings::{ObjectKind, Warnings};
use super::{Ours, TranslateConfig, Translation, Warning, tls, translate_part};
use crate::snapshot::{Snapshot, SnapshotKey};

/// What ties the translation of one Ingress of our class to others'.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Couplings {
    /// Its rule hosts, `server-alias` names and TLS hosts.
    hosts: Vec<HostMatch>,
    /// The Services it names (routes, default backend, custom error pages).
    services: Vec<ObjectRef>,
    /// It claims the table's default backend, or serves error pages from it.
    default_backend: bool,
    /// Suffixes (`example.com`) under which it has exact hosts (`a.example.com`): a wildcard TLS
    /// host of another Ingress decides whether those redirect to HTTPS.
    covered: Vec<String>,
    /// Suffixes of its wildcard TLS hosts.
    tls_wildcards: Vec<String>,
}

impl Couplings {
    /// The ties of `ingress`, whose annotations parsed to `parsed`; `global_errors`: the
    /// ConfigMap has `custom-http-errors` (served by the default backend where the Ingress has
    /// none of its own).
    pub(crate) fn of(ingress: &Ours<'_>, parsed: &Parsed, global_errors: bool) -> Couplings {
        let mut c = Couplings::default();
        let namespace = ingress.rank.object.namespace.as_str();
        let spec = ingress.ingress.spec.as_ref();
        let rules = spec.and_then(|s| s.rules.as_deref()).unwrap_or_default();
        let mut service = |name: Option<&str>| {
            if let Some(name) = name.filter(|n| !n.is_empty()) {
                c.services.push(ObjectRef::new(namespace, name));
            }
        };
        for rule in rules {
            for path in rule.http.as_ref().map(|h| h.paths.as_slice()).unwrap_or_default() {
                service(path.backend.service.as_ref().map(|s| s.name.as_str()));
            }
        }
        let default = spec.and_then(|s| s.default_backend.as_ref());
        service(default.and_then(|b| b.service.as_ref()).map(|s| s.name.as_str()));
        match &parsed.custom_errors {
            Some((_, Some(name))) => service(Some(name)),
            Some((_, None)) => c.default_backend = true,
            None => c.default_backend |= global_errors,
        }
        if default.is_some() && rules.is_empty() {
            c.default_backend = true;
        }
        let rule_hosts = rules.iter().filter_map(|r| HostMatch::parse(r.host.as_deref().unwrap_or("")).ok());
        c.hosts.extend(rule_hosts);
        if parsed.from_to_www {
            // The other name of each exact host (`www.` added or removed) redirects to it, unless
            // another Ingress has routes there.
            let others: Vec<HostMatch> = c.hosts.iter().filter_map(www_alias).collect();
            c.hosts.extend(others);
        }
        c.hosts.extend(parsed.server_aliases.iter().cloned());
        for entry in spec.and_then(|s| s.tls.as_deref()).unwrap_or_default() {
            let listed = entry.hosts.as_deref().unwrap_or_default();
            if listed.is_empty() && rules.is_empty() {
                c.hosts.push(HostMatch::Any);
            }
            if listed.is_empty() {
                // The entry covers the rule hosts, wildcards included.
                let wildcards = rules.iter().filter_map(|r| match HostMatch::parse(r.host.as_deref()?) {
                    Ok(HostMatch::Wildcard(suffix)) => Some(suffix),
                    _ => None,
                });
                c.tls_wildcards.extend(wildcards);
            }
            for host in listed.iter().filter_map(|h| HostMatch::parse(h).ok()) {
                if let HostMatch::Wildcard(suffix) = &host {
                    c.tls_wildcards.push(suffix.clone());
                }
                c.hosts.push(host);
            }
        }
        for host in &c.hosts {
            if let HostMatch::Exact(name) = host
                && let Some((label, suffix)) = name.split_once('.')
                && !label.is_empty()
            {
                c.covered.push(suffix.to_string());
            }
        }
        for list in [&mut c.covered, &mut c.tls_wildcards] {
            list.sort();
            list.dedup();
        }
        c.hosts.sort();
        c.hosts.dedup();
        c.services.sort();
        c.services.dedup();
        c
    }
}

/// The host `from-to-www-redirect` adds for `host`: `www.` removed or added (exact hosts only).
fn www_alias(host: &HostMatch) -> Option<HostMatch> {
    let HostMatch::Exact(name) = host else { return None };
    let other = match name.strip_prefix("www.") {
        Some(bare) => bare.to_string(),
        None => format!("www.{name}"),
    };
    HostMatch::parse(&other).ok()
}

/// Whether a change under `key` translates everything: IngressClasses decide which Ingresses
/// are ours; the settings ConfigMap, and the ConfigMaps it names (`add-headers`,
/// `proxy-set-headers`), set defaults of every route and the table's settings.
fn rebuilds_all(key: &SnapshotKey, snapshot: &Snapshot, config: &TranslateConfig) -> bool {
    match key {
        SnapshotKey::IngressClass(_) => true,
        // Gateway API objects are translated as a whole, after the Ingresses (`gateway/`).
        SnapshotKey::GatewayClass(_)
        | SnapshotKey::Gateway(_)
        | SnapshotKey::HttpRoute(_)
        | SnapshotKey::GrpcRoute(_)
        | SnapshotKey::TlsRoute(_)
        | SnapshotKey::ListenerSet(_)
        | SnapshotKey::ReferenceGrant(_) => true,
        SnapshotKey::Namespace(_) => !snapshot.gateways.is_empty(),
        SnapshotKey::ConfigMap(k) => config.settings.as_ref().is_some_and(|settings| {
            settings == k
                || snapshot.config_maps.get(settings).is_some_and(|cm| {
                    cm.data.iter().flatten().any(|(_, value)| names(k, &settings.namespace, value))
                })
        }),
        _ => false,
    }
}

/// Whether `value`, read in `namespace`, names `object`: its name (same namespace) or its
/// namespace/name.
fn names(object: &ObjectRef, namespace: &str, value: &str) -> bool {
    let value = value.trim();
    (object.namespace == namespace && value == object.name)
        || value.split_once('/').is_some_and(|(ns, n)| ns == object.namespace && n == object.name)
}

/// An Ingress's number in the [`Index`] (its key is two strings; the index holds many).
type Id = u32;

/// Who has which tie: the reverse of every Ingress's [`Couplings`].
#[derive(Debug, Default)]
struct Index {
    /// Ties not indexed yet (see [`Translator::prepare`]).
    pending: Vec<(ObjectRef, Couplings)>,
    ids: HashMap<ObjectRef, Id>,
    /// By [`Id`]; `None` for a number given back.
    entries: Vec<Option<(ObjectRef, Couplings)>>,
    free: Vec<Id>,
    hosts: HashMap<HostMatch, Vec<Id>>,
    services: HashMap<ObjectRef, Vec<Id>>,
    default_backend: Vec<Id>,
    covered: HashMap<String, Vec<Id>>,
    tls_wildcards: HashMap<String, Vec<Id>>,
}

impl Index {
    /// Indexes the pending ties.
    fn prepare(&mut self) {
        for (ingress, c) in std::mem::take(&mut self.pending) {
            self.insert(ingress, c);
        }
    }

    fn insert(&mut self, ingress: ObjectRef, c: Couplings) {
        self.remove(&ingress);
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.entries.push(None);
                Id::try_from(self.entries.len() - 1).unwrap_or(Id::MAX)
            }
        };
        fn add<K: std::hash::Hash + Eq + Clone>(map: &mut HashMap<K, Vec<Id>>, key: &K, id: Id) {
            match map.get_mut(key) {
                Some(ids) => ids.push(id),
                None => {
                    map.insert(key.clone(), vec![id]);
                }
            }
        }
        for host in &c.hosts {
            add(&mut self.hosts, host, id);
        }
        for service in &c.services {
            add(&mut self.services, service, id);
        }
        if c.default_backend {
            self.default_backend.push(id);
        }
        for suffix in &c.covered {
            add(&mut self.covered, suffix, id);
        }
        for suffix in &c.tls_wildcards {
            add(&mut self.tls_wildcards, suffix, id);
        }
        self.ids.insert(ingress.clone(), id);
        if let Some(slot) = self.entries.get_mut(id as usize) {
            *slot = Some((ingress, c));
        }
    }

    fn remove(&mut self, ingress: &ObjectRef) -> Option<Couplings> {
        fn drop_from<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Vec<Id>>, key: &K, id: Id) {
            if let Some(ids) = map.get_mut(key) {
                ids.retain(|i| *i != id);
                if ids.is_empty() {
                    map.remove(key);
                }
            }
        }
        let id = self.ids.remove(ingress)?;
        let (_, c) = self.entries.get_mut(id as usize)?.take()?;
        self.free.push(id);
        for host in &c.hosts {
            drop_from(&mut self.hosts, host, id);
        }
        for service in &c.services {
            drop_from(&mut self.services, service, id);
        }
        self.default_backend.retain(|i| *i != id);
        for suffix in &c.covered {
            drop_from(&mut self.covered, suffix, id);
        }
        for suffix in &c.tls_wildcards {
            drop_from(&mut self.tls_wildcards, suffix, id);
        }
        Some(c)
    }

    fn key(&self, id: Id) -> Option<&ObjectRef> {
        self.entries.get(id as usize)?.as_ref().map(|(k, _)| k)
    }

    /// The Ingresses indexed.
    fn ingresses(&self) -> impl Iterator<Item = &ObjectRef> {
        self.ids.keys()
    }

    /// The Ingresses that name `service`.
    fn users_of<'a>(&'a self, service: &ObjectRef) -> impl Iterator<Item = &'a ObjectRef> + 'a {
        self.services.get(service).into_iter().flatten().filter_map(|id| self.key(*id))
    }

    /// Every Ingress tied, directly or not, to one of `seeds` (which are included), with the
    /// ties recorded here and those in `fresh` (the new ties of changed Ingresses).
    fn closure(
        &self,
        seeds: BTreeSet<ObjectRef>,
        fresh: &HashMap<ObjectRef, Couplings>,
    ) -> BTreeSet<ObjectRef> {
        let mut reached: HashSet<Id> = HashSet::default();
        let mut queue: Vec<Id> = Vec::new();
        let mut default_done = false;
        let mut visit = |c: &Couplings, reached: &mut HashSet<Id>, queue: &mut Vec<Id>| {
            let mut add = |ids: Option<&Vec<Id>>| {
                for id in ids.into_iter().flatten() {
                    if reached.insert(*id) {
                        queue.push(*id);
                    }
                }
            };
            for host in &c.hosts {
                add(self.hosts.get(host));
            }
            for service in &c.services {
                add(self.services.get(service));
            }
            if c.default_backend && !default_done {
                default_done = true;
                add(Some(&self.default_backend));
            }
            for suffix in &c.covered {
                add(self.tls_wildcards.get(suffix));
            }
            for suffix in &c.tls_wildcards {
                add(self.covered.get(suffix));
            }
        };
        for seed in &seeds {
            if let Some(id) = self.ids.get(seed)
                && reached.insert(*id)
            {
                queue.push(*id);
            }
            if let Some(c) = fresh.get(seed) {
                visit(c, &mut reached, &mut queue);
            }
        }
        while let Some(id) = queue.pop() {
            let Some(Some((key, c))) = self.entries.get(id as usize) else { continue };
            visit(c, &mut reached, &mut queue);
            if let Some(c) = fresh.get(key) {
                visit(c, &mut reached, &mut queue);
            }
        }
        let mut group = seeds;
        group.extend(reached.into_iter().filter_map(|id| self.key(id).cloned()));
        group
    }
}

/// What [`Translator::update`] did.
#[derive(Debug)]
pub struct Update {
    /// What differs from the previous table; `None` when everything was translated again
    /// (the first time, or after a change to IngressClasses or the configuration).
    pub changes: Option<TableChanges>,
    /// Ingresses translated (again).
    pub translated: usize,
}

/// Translation that keeps its last result and redoes only what a change can affect.
#[derive(Debug, Default)]
pub struct Translator {
    /// The configuration of the last update; `None` before the first.
    config: Option<TranslateConfig>,
    translation: Translation,
    index: Index,
    slices: SliceIndex,
    /// The warnings about the default certificate (the others are about Ingresses).
    certificate_warnings: Vec<Warning>,
    /// A default certificate that is not a Secret (see [`Translator::set_default_certificate`]).
    certificate_override: Option<(ObjectRef, Certificate)>,
    /// The certificates [`Translator::apply_default_certificate`] put in the table that no TLS
    /// entry uses.
    certificates_added: Vec<ObjectRef>,
    /// The default certificate must be applied again at the next update.
    certificate_dirty: bool,
}

impl Translator {
    /// A translator that has translated nothing yet.
    pub fn new() -> Self {
        Translator::default()
    }

    /// The last translation.
    pub fn translation(&self) -> &Translation {
        &self.translation
    }

    /// Builds what only the next incremental update needs (the indexes of what ties Ingresses
    /// together, and of the Service of each EndpointSlice), which a full translation leaves for
    /// later: call it after publishing, off the way of the table. [`Translator::update`] calls it
    /// anyway when it is still to do.
    pub fn prepare(&mut self) {
        self.index.prepare();
        self.slices.prepare();
    }

    /// Serves names no TLS entry covers with `certificate`, stored under `key`, instead of the
    /// configured default certificate Secret (`weir serve --default-certificate-file`); `None`
    /// goes back to the Secret. Takes effect at the next [`Translator::update`].
    pub fn set_default_certificate(&mut self, certificate: Option<(ObjectRef, Certificate)>) {
        if self.certificate_override != certificate {
            self.certificate_override = certificate;
            self.certificate_dirty = true;
        }
    }

    /// Brings the translation up to date with `snapshot`, which differs from the snapshot of
    /// the previous call only under the keys `changed` (`None`: translate everything). The
    /// result equals `translate(snapshot, config)`.
    pub fn update(
        &mut self,
        snapshot: &Snapshot,
        changed: Option<&[SnapshotKey]>,
        config: &TranslateConfig,
    ) -> Update {
        let keys = match changed {
            Some(keys)
                if self.config.as_ref() == Some(config)
                    && snapshot.gateways.is_empty()
                    && !keys.iter().any(|k| rebuilds_all(k, snapshot, config)) =>
            {
                keys
            }
            // With Gateway API objects every change translates everything, but most change
            // a route or two: the dataplane is told which hosts differ.
            _ if self.config.as_ref() == Some(config) && !snapshot.gateways.is_empty() => {
                return self.rebuild_diffed(snapshot, config);
            }
            _ => return self.rebuild(snapshot, config),
        };
        self.prepare();
        let part_config = TranslateConfig { default_certificate: None, ..config.clone() };

        // The Ingresses a change reaches directly.
        let mut seeds = BTreeSet::new();
        let mut changed_ingresses = Vec::new();
        let mut secrets = Vec::new();
        let mut config_maps = Vec::new();
        for key in keys {
            match key {
                SnapshotKey::Ingress(k) => {
                    seeds.insert(k.clone());
                    if let Some(ingress) = snapshot.ingresses.get(k) {
                        changed_ingresses.push((k, ingress));
                    }
                }
                SnapshotKey::Service(k) | SnapshotKey::Endpoints(k) => {
                    seeds.extend(self.index.users_of(k).cloned());
                }
                SnapshotKey::EndpointSlice(k) => {
                    for service in self.slices.update(k, snapshot) {
                        seeds.extend(self.index.users_of(&service).cloned());
                    }
                }
                SnapshotKey::Secret(k) => secrets.push(k),
                // Not the settings ConfigMap nor one it names (those rebuild everything): only
                // annotations (`custom-headers`) can name it.
                SnapshotKey::ConfigMap(k) => config_maps.push(k),
                SnapshotKey::IngressClass(_)
                | SnapshotKey::GatewayClass(_)
                | SnapshotKey::Gateway(_)
                | SnapshotKey::HttpRoute(_)
                | SnapshotKey::GrpcRoute(_)
                | SnapshotKey::TlsRoute(_)
                | SnapshotKey::ListenerSet(_)
                | SnapshotKey::ReferenceGrant(_)
                | SnapshotKey::Namespace(_) => {}
            }
        }
        if !secrets.is_empty() || !config_maps.is_empty() {
            let named: Vec<&ObjectRef> = secrets.iter().chain(&config_maps).copied().collect();
            seeds.extend(self.referring_to(&named, snapshot));
        }

        // The new ties of changed Ingresses, then everything tied to them.
        let mut fresh = Vec::new();
        if !changed_ingresses.is_empty() {
            translate_part(snapshot, changed_ingresses, &self.slices, &part_config, Some(&mut fresh));
        }
        let group = self.index.closure(seeds, &fresh.into_iter().collect());

        // Translate the group again and replace its part of the table.
        let mut couplings = Vec::new();
        let part = translate_part(
            snapshot,
            group.iter().filter_map(|k| snapshot.ingresses.get(k).map(|i| (k, i))),
            &self.slices,
            &part_config,
            Some(&mut couplings),
        );
        let old: Vec<Couplings> = group.iter().filter_map(|k| self.index.remove(k)).collect();
        let claims_default = old.iter().chain(couplings.iter().map(|(_, c)| c)).any(|c| c.default_backend);
        for (ingress, c) in couplings {
            self.index.insert(ingress, c);
        }
        let changes = self.splice(&group, &old, claims_default, part);
        if !secrets.is_empty() || self.certificate_dirty {
            self.apply_default_certificate(snapshot, config);
        }
        self.translation.warnings.extend(self.certificate_warnings.iter().cloned());
        super::l4_apply(&mut self.translation, snapshot, &self.slices, config);
        Update { changes: Some(changes), translated: group.len() }
    }

    /// Translates everything and rebuilds the indexes.
    fn rebuild(&mut self, snapshot: &Snapshot, config: &TranslateConfig) -> Update {
        let part_config = TranslateConfig { default_certificate: None, ..config.clone() };
        // The old translation goes first: two at once would double the peak (and the allocator
        // keeps the peak). Freeing it costs this rebuild a few tens of ms at 10,000 Ingresses.
        self.translation = Translation::default();
        self.index = Index::default();
        self.slices = SliceIndex::new(snapshot);
        let mut couplings = Vec::with_capacity(snapshot.ingresses.len());
        self.translation = translate_part(
            snapshot,
            snapshot.ingresses.iter(),
            &self.slices,
            &part_config,
            Some(&mut couplings),
        );
        for (ingress, c) in couplings {
            self.index.insert(ingress, c);
        }
        self.config = Some(config.clone());
        self.apply_default_certificate(snapshot, config);
        self.translation.warnings.extend(self.certificate_warnings.iter().cloned());
        super::gateway_apply(&mut self.translation, snapshot, &self.slices, config);
        super::l4_apply(&mut self.translation, snapshot, &self.slices, config);
        Update { changes: None, translated: snapshot.ingresses.len() }
    }

    /// [`Translator::rebuild`], compared with the table before: the changes are what differs
    /// (`TableChanges::between`), so that the dataplane compiles only those hosts, unless the
    /// settings every host is compiled with changed. The old table stays until the new one is
    /// built (the peak a plain rebuild avoids; it is taken only with Gateways).
    fn rebuild_diffed(&mut self, snapshot: &Snapshot, config: &TranslateConfig) -> Update {
        let old = std::mem::take(&mut self.translation.table);
        let mut update = self.rebuild(snapshot, config);
        let new = &self.translation.table;
        if old.settings == new.settings {
            update.changes = Some(TableChanges::between(&old, new));
        }
        update
    }

    /// Ingresses of our class that name one of `secrets` (Secrets or ConfigMaps) in a TLS entry
    /// or in an annotation (any annotation whose value is the object's name in the Ingress's
    /// namespace, or its namespace/name): more than those that read it, never fewer.
    fn referring_to(&self, secrets: &[&ObjectRef], snapshot: &Snapshot) -> Vec<ObjectRef> {
        let mut out = Vec::new();
        for key in self.index.ingresses() {
            let Some(ingress) = snapshot.ingresses.get(key) else { continue };
            let names = |secret: &ObjectRef, value: &str| names(secret, &key.namespace, value);
            let tls = ingress.spec.as_ref().and_then(|s| s.tls.as_deref()).unwrap_or_default();
            let refers = secrets.iter().any(|secret| {
                tls.iter().any(|t| t.secret_name.as_deref().is_some_and(|n| names(secret, n)))
                    || ingress.metadata.annotations.iter().flatten().any(|(_, v)| names(secret, v))
            });
            if refers {
                out.push(key.clone());
            }
        }
        out
    }

    /// Replaces the part of the table the Ingresses of `group` made (their old ties are `old`)
    /// with `part`, their new translation. Returns the hosts and backends that differ.
    fn splice(
        &mut self,
        group: &BTreeSet<ObjectRef>,
        old: &[Couplings],
        claims_default: bool,
        part: Translation,
    ) -> TableChanges {
        let Translation { table: new, warnings, ingresses, .. } = part;
        let translation = &mut self.translation;
        let table = &mut translation.table;
        let mut changes = TableChanges::default();
        let old_hosts: HashSet<&HostMatch> = old.iter().flat_map(|c| &c.hosts).collect();

        // Virtual hosts: the group's hosts are its own; both lists are sorted by host.
        let mut previous: HashMap<HostMatch, VirtualHost> = HashMap::default();
        let mut kept = Vec::with_capacity(table.hosts.len());
        for vh in std::mem::take(&mut table.hosts) {
            if old_hosts.contains(&vh.host) {
                previous.insert(vh.host.clone(), vh);
            } else {
                kept.push(vh);
            }
        }
        for vh in &new.hosts {
            if previous.remove(&vh.host).as_ref() != Some(vh) {
                changes.hosts.insert(vh.host.clone());
            }
        }
        changes.hosts.extend(previous.into_keys());
        table.hosts = merge_sorted(kept, new.hosts, |vh| &vh.host);

        // Backends: those of the group's Services are its own.
        let mut previous: BTreeMap<BackendId, Backend> = BTreeMap::new();
        for service in old.iter().flat_map(|c| &c.services).collect::<BTreeSet<_>>() {
            let first = BackendId {
                namespace: service.namespace.clone(),
                service: service.name.clone(),
                port: ServicePort::Number(0),
            };
            let ids: Vec<BackendId> = table
                .backends
                .range(first..)
                .take_while(|(id, _)| id.namespace == service.namespace && id.service == service.name)
                .map(|(id, _)| id.clone())
                .collect();
            for id in ids {
                if let Some(backend) = table.backends.remove(&id) {
                    previous.insert(id, backend);
                }
            }
        }
        for (id, backend) in new.backends {
            if previous.remove(&id).as_ref() != Some(&backend) {
                changes.backends.insert(id.clone());
            }
            table.backends.insert(id, backend);
        }
        changes.backends.extend(previous.into_keys());
        if claims_default {
            table.default_backend = new.default_backend;
        }

        // TLS hosts, passthrough and client certificates are per host, like virtual hosts.
        let mut by_certificate: BTreeMap<Option<ObjectRef>, BTreeSet<HostMatch>> = BTreeMap::new();
        for entry in std::mem::take(&mut table.tls) {
            let hosts = entry.hosts.into_iter().filter(|h| !old_hosts.contains(h));
            by_certificate.entry(entry.certificate).or_default().extend(hosts);
        }
        for entry in new.tls {
            by_certificate.entry(entry.certificate).or_default().extend(entry.hosts);
        }
        table.tls = by_certificate
            .into_iter()
            .filter(|(_, hosts)| !hosts.is_empty())
            .map(|(certificate, hosts)| TlsEntry {
                hosts: hosts.into_iter().collect(),
                certificate,
                listener: None,
                alternatives: Vec::new(),
            })
            .collect();
        table.certificates.extend(new.certificates);
        let used: HashSet<&ObjectRef> = table.tls.iter().filter_map(|e| e.certificate.as_ref()).collect();
        let added = &self.certificates_added;
        table.certificates.retain(|k, _| used.contains(k) || added.contains(k));
        table.passthrough.retain(|p| !old_hosts.contains(&p.host));
        table.passthrough.extend(new.passthrough);
        table.passthrough.sort_by(|a, b| a.host.cmp(&b.host));
        table.passthrough.dedup_by(|a, b| a.host == b.host);
        table.client_auth.retain(|c| !old_hosts.contains(&c.host));
        table.client_auth.extend(new.client_auth);
        table.client_auth.sort_by(|a, b| a.host.cmp(&b.host));
        table.host_tls.retain(|h| !old_hosts.contains(&h.host));
        table.host_tls.extend(new.host_tls);
        table.host_tls.sort_by(|a, b| a.host.cmp(&b.host));

        // Warnings (those about the default certificate are added back by the caller) and the
        // Ingresses of our class.
        translation.warnings.retain(|w| w.kind == ObjectKind::Ingress && !group.contains(&w.object));
        translation.warnings.extend(warnings);
        // A part without the Ingress of the default backend cannot know the table has one.
        if translation.table.default_backend.is_some() {
            translation.warnings.retain(|w| {
                w.kind != ObjectKind::ConfigMap || w.message != super::build::NO_DEFAULT_BACKEND_FOR_ERRORS
            });
        }
        translation.warnings.sort();
        let kept: Vec<ObjectRef> =
            std::mem::take(&mut translation.ingresses).into_iter().filter(|k| !group.contains(k)).collect();
        translation.ingresses = merge_sorted(kept, ingresses, |k| k);
        changes
    }

    /// Puts the configured default certificate in the table, if its Secret is usable, and
    /// notes the warnings about it; then the one set by [`Translator::set_default_certificate`],
    /// which takes precedence.
    fn apply_default_certificate(&mut self, snapshot: &Snapshot, config: &TranslateConfig) {
        let table = &mut self.translation.table;
        let used: HashSet<&ObjectRef> = table.tls.iter().filter_map(|e| e.certificate.as_ref()).collect();
        for key in self.certificates_added.drain(..) {
            if !used.contains(&key) {
                table.certificates.remove(&key);
            }
        }
        table.default_certificate = None;
        let mut warnings = Warnings::default();
        let mut add = |key: &ObjectRef, cert: Certificate| {
            table.certificates.insert(key.clone(), cert);
            table.default_certificate = Some(key.clone());
            self.certificates_added.push(key.clone());
        };
        if let Some(secret) = &config.default_certificate
            && let Some(cert) = tls::default_certificate(secret, snapshot, &mut warnings)
        {
            add(secret, cert);
        }
        if let Some((key, cert)) = &self.certificate_override {
            add(key, cert.clone());
        }
        self.certificate_warnings = warnings.finish();
        self.certificate_dirty = false;
    }
}

/// Merges two lists sorted by `key` (with no key in both).
fn merge_sorted<T, K: Ord>(a: Vec<T>, b: Vec<T>, key: impl Fn(&T) -> &K) -> Vec<T> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let mut b = b.into_iter().peekable();
    for item in a {
        while let Some(next) = b.next_if(|n| key(n) < key(&item)) {
            out.push(next);
        }
        out.push(item);
    }
    out.extend(b);
    out
}
