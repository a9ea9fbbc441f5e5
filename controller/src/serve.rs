//! `weir serve`: the proxy fed by a source of Kubernetes objects.
//!
//! Data flow (shared/ARCHITECTURE.md): source → [`Snapshot`] → [`Translator`] → `RouteTable` →
//! [`Proxy::publish`] (one atomic swap). The admin listener serves `/healthz`, `/readyz` (ready
//! after the first publish) and `/metrics`.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use weir_dataplane::l4::{L4Config, L4Proxy};
use weir_dataplane::model::{Certificate, ObjectRef};
use weir_dataplane::proxy::limits;
use weir_dataplane::proxy::{Proxy, ProxyConfig};

use crate::metrics::Metrics;
use crate::snapshot::{Snapshot, SnapshotKey};
use crate::source::files::{self, ManifestDir};
use crate::source::kube::{self as kube_source, KubeOptions, KubeSource};
use crate::status::{self, Outcome, StatusOptions};
use crate::translate::{self, TranslateConfig, Translator};

/// Where `weir serve` reads objects from when it talks to a Kubernetes API server.
#[derive(Clone, Debug, Default)]
pub struct KubeServe {
    /// What to watch.
    pub source: KubeOptions,
    /// Status writing and leader election.
    pub status: StatusOptions,
}

/// Options of an in-process weir server.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The manifest directory (the embedded default source); ignored when `kube` is set.
    pub manifests: PathBuf,
    /// Read objects from the Kubernetes API instead of `manifests`.
    pub kube: Option<KubeServe>,
    /// Plain HTTP listener.
    pub listen_http: SocketAddr,
    /// HTTPS listener; `None`: no TLS listener.
    pub listen_https: Option<SocketAddr>,
    /// Admin listener (`/healthz`, `/readyz`, `/metrics`).
    pub listen_admin: SocketAddr,
    /// The IngressClass name weir serves.
    pub ingress_class: String,
    /// The IngressClass `spec.controller` value weir owns.
    pub controller_name: String,
    /// Serve Ingresses that name no class at all.
    pub watch_ingress_without_class: bool,
    /// The Secret serving TLS names no Ingress covers; `None`: a self-signed certificate.
    pub default_certificate: Option<ObjectRef>,
    /// A PEM certificate chain and key file serving TLS names no Ingress covers (standalone
    /// mode; re-read when they change). Takes precedence over `default_certificate`.
    pub default_certificate_files: Option<(PathBuf, PathBuf)>,
    /// Worker threads; only used by the binary, which builds the runtime.
    pub threads: Option<usize>,
    /// Listen backlog of the HTTP and HTTPS listeners; `None`: the kernel's `somaxconn`.
    pub listen_backlog: Option<u32>,
    /// How long a manifest change waits for further changes before it is translated.
    pub debounce: Duration,
    /// How often the directory is polled in addition to filesystem notifications.
    pub poll_interval: Duration,
    /// Proxy settings.
    pub proxy: ProxyConfig,
    /// The ConfigMap of global settings: watched in a cluster, read from the manifest
    /// directory otherwise; its keys override `proxy`.
    pub settings: Option<ObjectRef>,
    /// The TCP services ConfigMap (`--tcp-services-configmap`).
    pub tcp_services: Option<ObjectRef>,
    /// The UDP services ConfigMap (`--udp-services-configmap`).
    pub udp_services: Option<ObjectRef>,
    /// Tunables of the TCP and UDP services' listeners.
    pub l4: L4Config,
    /// How `/metrics` exposes the figures (names besides weir's).
    pub metrics: crate::metrics::MetricsOptions,
    /// Gateway API: the controller name and the listener ports served.
    pub gateway: translate::gateway::GatewayConfig,
}

impl Default for ServeOptions {
    fn default() -> Self {
        let translate = TranslateConfig::default();
        ServeOptions {
            manifests: PathBuf::from("."),
            kube: None,
            listen_http: SocketAddr::from(([127, 0, 0, 1], 0)),
            listen_https: None,
            listen_admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            ingress_class: translate.ingress_class,
            controller_name: translate.controller_name,
            watch_ingress_without_class: translate.watch_ingress_without_class,
            default_certificate: translate.default_certificate,
            default_certificate_files: None,
            threads: None,
            listen_backlog: None,
            debounce: Duration::from_millis(100),
            poll_interval: Duration::from_secs(2),
            proxy: ProxyConfig::default(),
            settings: Some(translate::settings::default_configmap()),
            tcp_services: None,
            udp_services: None,
            l4: L4Config::default(),
            metrics: crate::metrics::MetricsOptions::default(),
            gateway: translate::gateway::GatewayConfig::default(),
        }
    }
}

impl ServeOptions {
    fn translate_config(&self) -> TranslateConfig {
        TranslateConfig {
            ingress_class: self.ingress_class.clone(),
            controller_name: self.controller_name.clone(),
            watch_ingress_without_class: self.watch_ingress_without_class,
            default_certificate: self.default_certificate.clone(),
            settings: self.settings.clone(),
            tcp_services: self.tcp_services.clone(),
            udp_services: self.udp_services.clone(),
            listener_ports: Default::default(),
            gateway: self.gateway.clone(),
        }
    }
}

/// A running weir: listeners bound, source watched, routes published.
pub struct Running {
    /// Where the HTTP listener is bound.
    pub http_addr: SocketAddr,
    /// Where the HTTPS listener is bound, if there is one.
    pub https_addr: Option<SocketAddr>,
    /// Where the admin listener is bound.
    pub admin_addr: SocketAddr,
    proxy: Proxy,
    l4: L4Proxy,
    versions: watch::Receiver<u64>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Binds the listeners, loads the manifest directory, publishes the first table and starts
    /// watching the directory for changes.
    pub async fn start(opts: ServeOptions) -> anyhow::Result<Running> {
        let http = limits::bind(opts.listen_http, opts.listen_backlog)
            .with_context(|| format!("binding the HTTP listener on {}", opts.listen_http))?;
        let admin = TcpListener::bind(opts.listen_admin)
            .await
            .with_context(|| format!("binding the admin listener on {}", opts.listen_admin))?;
        let https = match opts.listen_https {
            Some(addr) => Some(
                limits::bind(addr, opts.listen_backlog)
                    .with_context(|| format!("binding the HTTPS listener on {addr}"))?,
            ),
            None => None,
        };
        let https_addr = https.as_ref().map(TcpListener::local_addr).transpose()?;
        let http_addr = http.local_addr()?;
        let admin_addr = admin.local_addr()?;
        let proxy = Proxy::new(opts.proxy.clone());
        let metrics = Arc::new(Metrics::with_options(opts.metrics.clone()));
        metrics.observe(&proxy);
        let l4 = L4Proxy::new(opts.l4.clone(), &proxy);
        crate::logging::reopen_on_sigusr1(proxy.clone(), l4.clone());
        metrics.l4.observe(&l4);
        if let Some(kube) = &opts.kube {
            metrics.observe_leader(kube.status.lease.clone(), kube.status.leader.clone());
        }
        let ready = Arc::new(AtomicBool::new(false));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (version_tx, versions) = watch::channel(0u64);
        let mut publisher = Publisher {
            proxy: proxy.clone(),
            config: opts.translate_config(),
            metrics: metrics.clone(),
            ready: ready.clone(),
            versions: version_tx,
            reported: BTreeSet::new(),
            cert_files: opts.default_certificate_files.clone().map(CertFiles::new),
            translator: Translator::new(),
            in_sync: false,
            kube_snapshot: None,
            l4: l4.clone(),
            l4_reported: BTreeSet::new(),
            l4_warnings: Vec::new(),
        };
        publisher.config.listener_ports = crate::l4_serve::listener_ports(http_addr, https_addr, admin_addr);

        let mut tasks = Vec::new();
        if let Some(kube) = &opts.kube {
            // A configuration problem is a usage error; an unreachable API server is retried.
            let config = kube_source::config(kube.source.kubeconfig.as_deref()).await?;
            // Watches, translation and status writes on a thread of their own: a full rebuild
            // of a large table never stalls the proxy's workers (with `--threads 1`, its only
            // one).
            let (kube, stop) = (kube.clone(), shutdown_rx.clone());
            tasks.push(spawn_dedicated("weir-kube", async move {
                match kube_source::client(config) {
                    Ok(client) => kube_loop(client, kube, publisher, stop).await,
                    Err(error) => tracing::error!(%error, "cannot make a Kubernetes API client"),
                }
            })?);
        } else {
            tasks.push(Self::start_files(&opts, publisher, shutdown_rx.clone()).await?);
        }
        let serve_proxy = proxy.clone();
        let stop = wait_for(shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(error) = serve_proxy.serve(http, stop).await {
                tracing::error!(%error, "HTTP listener failed");
            }
        }));
        if let Some(https) = https {
            let serve_proxy = proxy.clone();
            let stop = wait_for(shutdown_rx.clone());
            tasks.push(tokio::spawn(async move {
                if let Err(error) = serve_proxy.serve_tls(https, stop).await {
                    tracing::error!(%error, "HTTPS listener failed");
                }
            }));
        }
        tasks.push(tokio::spawn(crate::memory::release_after_parking(
            proxy.clone(),
            wait_for(shutdown_rx.clone()),
        )));
        tasks.push(tokio::spawn(serve_admin(admin, metrics, ready, wait_for(shutdown_rx))));
        let https_shown = https_addr.map_or_else(|| "none".to_string(), |a| a.to_string());
        tracing::info!(http = %http_addr, https = %https_shown, admin = %admin_addr, "weir is serving");
        Ok(Running { http_addr, https_addr, admin_addr, proxy, l4, versions, shutdown, tasks })
    }

    /// Loads the manifest directory, publishes the first table and watches the directory, all
    /// on a thread of its own (see [`spawn_dedicated`]).
    async fn start_files(
        opts: &ServeOptions,
        mut publisher: Publisher,
        shutdown_rx: watch::Receiver<bool>,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let root = opts.manifests.clone();
        let (debounce, poll) = (opts.debounce, opts.poll_interval);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
        let task = spawn_dedicated("weir-manifests", async move {
            let mut dir = ManifestDir::new(&root);
            // A missing directory is a usage error; a broken file is not (it is reported and
            // skipped).
            let started = dir.rescan(true).with_context(|| format!("reading --manifests {}", root.display()));
            let (change_tx, change_rx) = mpsc::channel(1);
            let watched = started.and_then(|_| Ok(files::watch_paths(&root, change_tx, poll)?));
            let (guard, seen) = match watched {
                Ok(watched) => watched,
                Err(error) => {
                    let _ = ready_tx.send(Err(error));
                    return;
                }
            };
            publisher.publish(&mut dir, Waited::default());
            tracing::info!(manifests = %root.display(), "serving the manifest directory");
            let _ = ready_tx.send(Ok(()));
            let watcher = Watcher { changes: change_rx, seen, _guard: guard };
            watch_loop(dir, watcher, publisher, debounce, shutdown_rx, poll).await;
        })?;
        ready_rx.await.unwrap_or_else(|_| Err(anyhow::anyhow!("the manifest thread stopped")))?;
        Ok(task)
    }

    /// The version of the routing table currently served (0 before the first publish).
    pub fn table_version(&self) -> u64 {
        self.proxy.version()
    }

    /// Waits until a table newer than `greater_than` is published.
    pub async fn wait_for_version(&self, greater_than: u64, timeout: Duration) -> anyhow::Result<u64> {
        let mut rx = self.versions.clone();
        let wait = rx.wait_for(|v| *v > greater_than);
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(v)) => Ok(*v),
            Ok(Err(_)) => anyhow::bail!("weir stopped before publishing a table newer than {greater_than}"),
            Err(_) => anyhow::bail!("no table newer than {greater_than} within {timeout:?}"),
        }
    }

    /// Waits for a shutdown signal (SIGTERM or Ctrl-C), then shuts down.
    pub async fn run_until_signal(self) {
        wait_for_signal().await;
        tracing::info!("shutting down: draining in-flight requests");
        self.shutdown().await;
    }

    /// Stops accepting, lets in-flight requests finish (bounded by the proxy's drain timeout)
    /// and stops watching.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        self.l4.shutdown();
        for task in self.tasks {
            if let Err(error) = task.await
                && error.is_panic()
            {
                tracing::error!(%error, "a weir task panicked");
            }
        }
    }
}

/// Runs `future` on a thread of its own, in a single-threaded runtime; the returned task ends
/// with it. Rebuilds allocate and free a table's worth of memory: on one thread, the allocator
/// reuses it, where rebuilds moving between runtime workers would keep a copy per thread's
/// arena (glibc).
fn spawn_dedicated(
    name: &str,
    future: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(future),
                Err(error) => tracing::error!(%error, "cannot start a runtime for a dedicated thread"),
            }
            let _ = done_tx.send(());
        })
        .with_context(|| format!("starting the {name} thread"))?;
    Ok(tokio::spawn(async move {
        let _ = done_rx.await;
    }))
}

/// Resolves when `rx` turns true (or its sender is gone).
async fn wait_for(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops weir");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Translates and publishes; remembers which problems were already logged so that a reload
/// logs only what is new.
struct Publisher {
    proxy: Proxy,
    config: TranslateConfig,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    versions: watch::Sender<u64>,
    reported: BTreeSet<String>,
    cert_files: Option<CertFiles>,
    /// Translates only what changed since its last update.
    translator: Translator,
    /// Whether the proxy serves the translator's last table, so that the next publish can
    /// compile only what changed (not after a rejected table).
    in_sync: bool,
    /// The Kubernetes source's last snapshot, to tell what changed since.
    kube_snapshot: Option<Snapshot>,
    /// The TCP and UDP services' listeners.
    l4: L4Proxy,
    /// The L4 bind errors already logged.
    l4_reported: BTreeSet<String>,
    /// The L4 bind errors of the last publish, as warnings on their ConfigMaps.
    l4_warnings: Vec<translate::Warning>,
}

/// The default certificate from a file pair: re-read when a file changes; the last good one is
/// kept while the files are unusable.
struct CertFiles {
    paths: (PathBuf, PathBuf),
    /// Modification time and length of both files when last read.
    seen: Option<[(std::time::SystemTime, u64); 2]>,
    good: Option<Certificate>,
}

/// Where a file default certificate goes in the table.
fn file_certificate_ref() -> ObjectRef {
    ObjectRef::new("weir", "default-certificate-file")
}

impl CertFiles {
    fn new(paths: (PathBuf, PathBuf)) -> Self {
        CertFiles { paths, seen: None, good: None }
    }

    fn stamp(&self) -> Option<[(std::time::SystemTime, u64); 2]> {
        let one = |p: &PathBuf| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
        Some([one(&self.paths.0)?, one(&self.paths.1)?])
    }

    /// Re-reads the files if they changed; true if the certificate in use changed.
    fn refresh(&mut self) -> bool {
        let stamp = self.stamp();
        if stamp.is_some() && stamp == self.seen {
            return false;
        }
        self.seen = stamp;
        let (crt, key) = &self.paths;
        let read = std::fs::read_to_string(crt)
            .and_then(|chain_pem| Ok(Certificate { chain_pem, key_pem: std::fs::read_to_string(key)? }));
        let cert = match read {
            Ok(cert) => cert,
            Err(error) => {
                tracing::warn!(cert = %crt.display(), key = %key.display(), %error, "reading the default certificate files failed; keeping the last good one");
                return false;
            }
        };
        if let Err(error) = weir_dataplane::tls::certified_key(&cert) {
            tracing::warn!(cert = %crt.display(), key = %key.display(), %error, "default certificate files unusable; keeping the last good one");
            return false;
        }
        if self.good.as_ref() == Some(&cert) {
            return false;
        }
        tracing::info!(cert = %crt.display(), "default certificate loaded from files");
        self.good = Some(cert);
        true
    }
}

impl Publisher {
    fn publish(&mut self, dir: &mut ManifestDir, waited: Waited) {
        let mut problems: BTreeSet<String> = dir.duplicates().into_iter().collect();
        problems.extend(dir.errors().iter().map(|e| e.to_string()));
        self.metrics.manifest_errors.set(dir.errors().len() as i64);
        let changes = dir.take_changes();
        self.publish_snapshot(dir.current(), Some(&changes), problems, waited);
    }

    fn publish_kube(&mut self, source: &KubeSource) -> Option<Outcome> {
        let snapshot = source.snapshot();
        let changes = self.kube_snapshot.as_ref().map(|old| snapshot.changes_since(old));
        // Nothing changed since the table served (a wake-up without a change, such as the
        // reflectors' first lists, which notify while nobody waits yet and so leave a wake-up
        // behind for the first burst): no table. With Gateway API objects every table is a full
        // translation (0.9-1.7 s at 5,000 HTTPRoutes: bench/RESULTS.md). A rejected last table,
        // or a changed default certificate file, is still published again.
        if changes.as_ref().is_some_and(Vec::is_empty)
            && self.in_sync
            && !self.cert_files.as_mut().is_some_and(CertFiles::refresh)
        {
            return None;
        }
        // Only our own status writes came back: nothing to translate (`snapshot::status_only`).
        let changes = match (changes, &self.kube_snapshot) {
            (Some(keys), Some(old)) if !keys.is_empty() => {
                let keys = crate::snapshot::status_only::spec_changes(old, &snapshot, &keys);
                if keys.is_empty() {
                    self.kube_snapshot = Some(snapshot);
                    return None;
                }
                Some(keys)
            }
            (changes, _) => changes,
        };
        self.publish_snapshot(&snapshot, changes.as_deref(), BTreeSet::new(), Waited::default());
        self.kube_snapshot = Some(snapshot);
        let translation = self.translator.translation();
        Some(Outcome {
            ingresses: translation.ingresses.iter().cloned().collect(),
            warnings: translation.warnings.iter().chain(&self.l4_warnings).cloned().collect(),
            gateway: translation.gateway.clone(),
        })
    }

    /// Translates what changed (`changed` keys; `None`: everything) and publishes the table.
    fn publish_snapshot(
        &mut self,
        snapshot: &Snapshot,
        changed: Option<&[SnapshotKey]>,
        mut problems: BTreeSet<String>,
        waited: Waited,
    ) {
        let started = std::time::Instant::now();
        if let Some(files) = &mut self.cert_files {
            files.refresh();
            self.translator
                .set_default_certificate(files.good.clone().map(|cert| (file_certificate_ref(), cert)));
        }
        let update = self.translator.update(snapshot, changed, &self.config);
        let translated = started.elapsed();
        let translation = self.translator.translation();
        self.metrics.translation_warnings.set(translation.warnings.len() as i64);
        // The error log's level and syslog first: this table's warnings go where it says.
        crate::logging::apply(&translation.table.settings.logging);
        problems.extend(translation.warnings.iter().map(|w| w.to_string()));
        for problem in problems.difference(&self.reported) {
            tracing::warn!("{problem}");
        }
        self.reported = problems;
        let changes = update.changes.as_ref().filter(|_| self.in_sync);
        match self.proxy.publish_changes(&translation.table, changes) {
            Ok(version) => {
                self.in_sync = true;
                self.metrics.reloaded(true);
                self.metrics.certificates(&translation.table);
                self.metrics.table_version.set(version as i64);
                self.ready.store(true, Ordering::Release);
                let _ = self.versions.send(version);
                tracing::info!(
                    version,
                    ingresses = translation.ingresses.len(),
                    warnings = translation.warnings.len(),
                    retranslated = update.translated,
                    changed_hosts = changes.map_or(translation.table.hosts.len(), |c| c.hosts.len()),
                    debounce_ms = waited.debounce.as_secs_f64() * 1e3,
                    scan_ms = waited.scan.as_secs_f64() * 1e3,
                    translate_ms = translated.as_secs_f64() * 1e3,
                    total_ms = started.elapsed().as_secs_f64() * 1e3,
                    "routing table published"
                );
            }
            Err(error) => {
                // The last good table keeps serving.
                self.in_sync = false;
                self.metrics.reloaded(false);
                tracing::error!(%error, "routing table rejected; the previous table keeps serving");
            }
        }
        self.publish_l4();
        // After the swap: what only the next change needs.
        self.translator.prepare();
        if update.changes.is_none() {
            // A full rebuild freed a table's worth: give it back now, not at the allocator's pace.
            crate::memory::release_free_memory();
        }
    }
}

impl Publisher {
    /// Makes the translated table's TCP and UDP services live; ports that cannot be bound
    /// become errors on their ConfigMap (logged once, Events in a cluster).
    fn publish_l4(&mut self) {
        let table = &self.translator.translation().table;
        self.l4_warnings = crate::l4_serve::publish(&self.l4, table, &self.config, &mut self.l4_reported);
    }
}

/// The file watcher's side of the watch loop.
struct Watcher {
    /// `true`: a notification; `false`: the poll.
    changes: mpsc::Receiver<bool>,
    /// What the notifications named.
    seen: files::SeenCell,
    _guard: files::WatchGuard,
}

/// What a publish waited for before translating: the settling of a burst of notifications,
/// then the scan of the directory.
#[derive(Clone, Copy, Debug, Default)]
struct Waited {
    debounce: Duration,
    scan: Duration,
}

async fn watch_loop(
    mut dir: ManifestDir,
    mut watcher: Watcher,
    mut publisher: Publisher,
    debounce: Duration,
    mut shutdown: watch::Receiver<bool>,
    poll: Duration,
) {
    // Default certificate files are polled (they usually live outside the manifest directory).
    let mut cert_poll = tokio::time::interval(poll.min(Duration::from_secs(1)));
    cert_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let notified = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            change = watcher.changes.recv() => match change {
                Some(notified) => notified,
                None => return,
            },
            _ = cert_poll.tick(), if publisher.cert_files.is_some() => {
                if publisher.cert_files.as_mut().is_some_and(CertFiles::refresh) {
                    publisher.publish(&mut dir, Waited::default());
                }
                continue;
            }
        };
        let mut waited = Waited::default();
        if notified {
            waited.debounce = files::settle(&watcher.seen, &mut watcher.changes, debounce).await;
        }
        let seen = std::mem::take(&mut *watcher.seen.lock().unwrap_or_else(|p| p.into_inner()));
        let started = std::time::Instant::now();
        let scan = if seen.everything { dir.rescan(true) } else { dir.rescan_paths(&seen.paths) };
        waited.scan = started.elapsed();
        match scan {
            Ok(scan) if scan.changed => publisher.publish(&mut dir, waited),
            // Nothing to translate, but a file may have broken or healed: keep the metric true.
            Ok(_) => {
                publisher.metrics.manifest_errors.set(dir.errors().len() as i64);
            }
            Err(error) => {
                tracing::warn!(%error, "rescanning the manifest directory failed; keeping the current table")
            }
        }
    }
}

/// The Kubernetes source: connect, discover, reflect, wait for every store to sync, then
/// publish each debounced burst of changes. Connection problems are retried; until the first
/// publish `/readyz` says not ready.
/// How long a publish waits for Secrets newly named by annotations to be listed.
const SECRET_LIST_WAIT: Duration = Duration::from_secs(2);

async fn kube_loop(
    client: ::kube::Client,
    kube: KubeServe,
    mut publisher: Publisher,
    mut shutdown: watch::Receiver<bool>,
) {
    let setup = async {
        let endpoints_api = kube_source::discover_endpoints_api_retrying(&client).await;
        // The Gateway API where served (else logged once; Ingresses are served either way).
        let gateway = crate::gateway_source::discover_retrying(&client).await;
        let options = kube_source::KubeOptions { gateway, ..kube.source.clone() };
        let source = KubeSource::start(&client, &options, endpoints_api);
        let started = std::time::Instant::now();
        if !source.wait_until_synced().await {
            tracing::error!("a reflector stopped before its first list; nothing is published");
            return None;
        }
        tracing::info!(sync_ms = started.elapsed().as_millis() as u64, "every reflector synced");
        Some(source)
    };
    let stop = shutdown.clone();
    let mut source = tokio::select! {
        ready = setup => match ready {
            Some(ready) => ready,
            None => return,
        },
        _ = wait_for(stop) => return,
    };
    source.track_referenced_secrets(SECRET_LIST_WAIT).await;
    let (outcome_tx, outcomes) = watch::channel(publisher.publish_kube(&source).unwrap_or_default());
    let status =
        status::spawn(client, kube.status.clone(), source.stores.clone(), outcomes, shutdown.clone());
    let mut settings = None;
    loop {
        if let Some(name) = &kube.source.configmap {
            let now = source.stores.settings();
            if now != settings {
                match &now {
                    Some(data) => {
                        tracing::info!(configmap = %name, keys = data.len(), "settings ConfigMap read")
                    }
                    None => tracing::info!(configmap = %name, "settings ConfigMap not found; defaults apply"),
                }
                settings = now;
            }
        }
        tokio::select! {
            _ = source.next_burst() => {}
            _ = shutdown.wait_for(|s| *s) => break,
        }
        source.track_referenced_secrets(SECRET_LIST_WAIT).await;
        if let Some(outcome) = publisher.publish_kube(&source) {
            outcome_tx.send_replace(outcome);
        }
    }
    drop(outcome_tx);
    if let Err(error) = status.await {
        tracing::error!(%error, "the status writer failed");
    }
}

async fn serve_admin(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    tracing::warn!(%error, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let accept = req.headers().get(http::header::ACCEPT).and_then(|v| v.to_str().ok());
                let format = crate::metrics::Format::negotiate(accept);
                let response = admin_response(req.uri().path(), format, &metrics, &ready);
                async move { Ok::<_, Infallible>(response) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%error, "admin connection ended with an error");
            }
        });
    }
}

fn admin_response(
    path: &str,
    format: crate::metrics::Format,
    metrics: &Metrics,
    ready: &AtomicBool,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/healthz" => (StatusCode::OK, "text/plain; charset=utf-8", Bytes::from_static(b"ok\n")),
        "/readyz" if ready.load(Ordering::Acquire) => {
            (StatusCode::OK, "text/plain; charset=utf-8", Bytes::from_static(b"ready\n"))
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"no routing table published yet\n"),
        ),
        "/metrics" => (StatusCode::OK, format.content_type(), metrics.render(format)),
        _ => (StatusCode::NOT_FOUND, "text/plain; charset=utf-8", Bytes::from_static(b"404 Not Found\n")),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    response
}
