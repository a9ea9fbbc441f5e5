//! The `weir` command line: `serve`, `node`, `check`, `dump` and `echo`.
//!
//! The listener flags are stable: the chart, the docs and the benchmarks depend on them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use std::time::Duration;

use weir_dataplane::model::ObjectRef;
use weir_dataplane::proxy::ProxyConfig;
use weir_dataplane::proxy::limits::{self, ConnLimitConfig};

use crate::serve::{KubeServe, Running, ServeOptions};
use crate::source::files::ManifestDir;
use crate::source::kube::{Kinds, KubeOptions};
use crate::status::StatusOptions;

use crate::translate::{self, Severity, TranslateConfig, Translation};

/// weir: a Kubernetes Ingress controller and edge proxy.
#[derive(Debug, Parser)]
#[command(name = "weir", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Log filter (tracing EnvFilter syntax); RUST_LOG overrides it. Release builds log at most
    /// `debug` (trace-level events are compiled out). rustls logs only errors unless the filter
    /// names it (`--log-level info,rustls=debug`): its warnings are about what clients send,
    /// one line per connection (an IP address as SNI, for one).
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy, routing by the Ingresses found in a manifest directory (hot-reloaded).
    Serve(Box<ServeArgs>),
    /// Translate a manifest directory and print every warning; exit non-zero on errors.
    Check(SourceArgs),
    /// Translate a manifest directory and print the routing table as YAML.
    Dump(SourceArgs),
    /// Run a debugging backend that answers every request with JSON describing it.
    Echo(EchoArgs),
    /// Program this node's kernel so that Service virtual IPs reach ready endpoints (kube-proxy).
    Node(crate::node::NodeArgs),
    /// Turn the Ingresses of a manifest directory into Gateway API objects (GatewayClass,
    /// Gateways, HTTPRoutes); what cannot be converted is listed on stderr and atop the output.
    Migrate(crate::migrate::MigrateArgs),
}

/// Where the objects come from and which of them are weir's.
#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Directory of Kubernetes YAML manifests (Ingress, IngressClass, Service, EndpointSlice,
    /// Endpoints, Secret); multi-document files and `kind: List` are read. Without it, `serve`
    /// reads the Kubernetes API (`--kubeconfig`, else in-cluster configuration).
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// The IngressClass name weir serves.
    #[arg(long, default_value = "weir", value_name = "NAME")]
    pub ingress_class: String,
    /// The IngressClass `spec.controller` weir owns.
    #[arg(long, default_value = "weir.dev/ingress-controller", value_name = "NAME")]
    pub controller_name: String,
    /// Also serve Ingresses that name no class.
    #[arg(long)]
    pub watch_ingress_without_class: bool,
    /// The `kubernetes.io/tls` Secret serving TLS names no Ingress covers (default: a
    /// self-signed certificate generated at start-up).
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_object_ref)]
    pub default_certificate: Option<ObjectRef>,
    /// ConfigMap of global settings (ingress-nginx's keys), hot-reloaded: watched in a cluster;
    /// with --manifests, read from DIR (default: default/weir-settings, used when DIR has it).
    #[arg(long, value_name = "NS/NAME", value_parser = parse_object_ref)]
    pub configmap: Option<ObjectRef>,
    /// ConfigMap of TCP services (ingress-nginx's format: key = port to listen on, value =
    /// `namespace/service:port[:PROXY][:PROXY]`), hot-reloaded; with --manifests, read from DIR.
    #[arg(long, value_name = "NS/NAME", value_parser = parse_object_ref)]
    pub tcp_services_configmap: Option<ObjectRef>,
    /// ConfigMap of UDP services (same format, without PROXY), hot-reloaded; with --manifests,
    /// read from DIR.
    #[arg(long, value_name = "NS/NAME", value_parser = parse_object_ref)]
    pub udp_services_configmap: Option<ObjectRef>,
    /// The GatewayClass `spec.controllerName` weir owns (Gateway API).
    #[arg(long, default_value = "weir.dev/gateway-controller", value_name = "NAME")]
    pub gateway_controller_name: String,
    /// The Gateway listener port served by --listen-http (the port clients reach through
    /// weir's Service).
    #[arg(long, default_value_t = 80, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub gateway_http_port: u16,
    /// The Gateway listener port served by --listen-https.
    #[arg(long, default_value_t = 443, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub gateway_https_port: u16,
}

fn parse_object_ref(s: &str) -> Result<ObjectRef, String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(ObjectRef::new(ns, name))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

impl SourceArgs {
    pub(crate) fn translate_config(&self) -> TranslateConfig {
        TranslateConfig {
            ingress_class: self.ingress_class.clone(),
            controller_name: self.controller_name.clone(),
            watch_ingress_without_class: self.watch_ingress_without_class,
            default_certificate: self.default_certificate.clone(),
            settings: Some(self.configmap.clone().unwrap_or_else(translate::settings::default_configmap)),
            tcp_services: self.tcp_services_configmap.clone(),
            udp_services: self.udp_services_configmap.clone(),
            listener_ports: Default::default(),
            gateway: translate::gateway::GatewayConfig {
                controller_name: self.gateway_controller_name.clone(),
                http_port: i32::from(self.gateway_http_port),
                https_port: i32::from(self.gateway_https_port),
            },
        }
    }
}

/// `weir serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The source.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Plain HTTP listener.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    pub listen_http: SocketAddr,
    /// HTTPS listener: TLS termination, certificate by SNI, HTTP/1.1 or HTTP/2 by ALPN.
    #[arg(long, default_value = "0.0.0.0:8443", value_name = "ADDR")]
    pub listen_https: SocketAddr,
    /// Admin listener: /healthz, /readyz, /metrics.
    #[arg(long, default_value = "127.0.0.1:9090", value_name = "ADDR")]
    pub listen_admin: SocketAddr,
    /// The port in the `Location` of HTTP → HTTPS redirects (left out of the URL when 443).
    #[arg(long, default_value_t = 443, value_name = "PORT")]
    pub https_redirect_port: u16,
    /// Send `Strict-Transport-Security: max-age=SECONDS` on HTTPS responses (default: no HSTS).
    #[arg(long, value_name = "SECONDS")]
    pub hsts_max_age: Option<u64>,
    /// Add `includeSubDomains` to the HSTS header.
    #[arg(long, requires = "hsts_max_age")]
    pub hsts_include_subdomains: bool,
    /// PEM certificate chain file of the default certificate (standalone mode; re-read when it
    /// changes). Needs --default-key-file; takes precedence over --default-certificate.
    #[arg(long, value_name = "FILE", requires = "default_key_file")]
    pub default_certificate_file: Option<PathBuf>,
    /// PEM private key file of the default certificate.
    #[arg(long, value_name = "FILE", requires = "default_certificate_file")]
    pub default_key_file: Option<PathBuf>,
    /// Expect a PROXY protocol (v1 or v2) header on every connection of both listeners (behind
    /// an L4 load balancer); connections without one are closed.
    #[arg(long)]
    pub proxy_protocol: bool,
    /// Worker threads (default: the number of CPUs); 1 runs the proxy on a single thread. The
    /// TCP and UDP services (--tcp-services-configmap) run on as many threads of their own,
    /// started with their first port.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Let the kernel back weir's heap with transparent huge pages (2 MiB pages) where its
    /// THP mode allows. Off by default: weir's allocator asks for them, and with them an idle
    /// proxy's resident memory grows in 2 MiB steps and keeps freed memory resident (twice the
    /// memory per idle connection in bench/idle; nginx and HAProxy, on malloc, do not ask).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, value_name = "BOOL")]
    pub transparent_huge_pages: bool,
    /// Client connections open at once over all listeners; more are reset at once. 0: as many
    /// as the open-file limit allows (two descriptors per connection, after a reserve), so that
    /// weir refuses connections before it runs out of descriptors.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_connections: usize,
    /// Client connections open at once from one client address (the PROXY protocol's client
    /// behind --proxy-protocol); more are reset at once. 0: no per-client limit.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_connections_per_client: u32,
    /// Listen backlog of the HTTP and HTTPS listeners. 0: the kernel's net.core.somaxconn.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub listen_backlog: u32,
    /// Longest wait for a write to a client to make progress (nginx's send_timeout): a client
    /// that stops reading a response is disconnected after it. 0: no limit.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub client_send_timeout: u64,
    /// The address the TCP and UDP services listen on (default: every address, IPv6 and IPv4).
    #[arg(long, value_name = "IP")]
    pub l4_listen_address: Option<std::net::IpAddr>,
    /// UDP flows (client address and port) kept per UDP service; past it the oldest flow is
    /// evicted.
    #[arg(long, default_value_t = 16_384, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub udp_max_flows: u32,
    /// The Kubernetes API source (used when `--manifests` is not given).
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Record request metrics (`--metrics=false`: none are recorded; the controller's own stay).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, value_name = "BOOL")]
    pub metrics: bool,
    /// Label request metrics with the virtual host (ingress-nginx's --metrics-per-host).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, value_name = "BOOL")]
    pub metrics_per_host: bool,
    /// Distinct hosts labelled at most; routes of further hosts count with an empty host label.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub metrics_max_hosts: usize,
    /// Also expose the metrics under another controller's names and labels, for its dashboards
    /// and alerts.
    #[arg(long, value_enum, value_name = "NAMES")]
    pub metrics_compat: Option<MetricsCompat>,
    /// Where the access log goes: off, stdout, or an absolute file path (appended to; reopened
    /// on SIGUSR1, as logrotate's postrotate expects). The ConfigMap's access-log-path overrides it.
    #[arg(long, default_value = "stdout", value_name = "off|stdout|PATH", value_parser = parse_access_log)]
    pub access_log: weir_dataplane::proxy::accesslog::Output,
    /// Access-log lines queued for the writer at most; past it lines are dropped and counted
    /// (weir_access_log_dropped_total).
    #[arg(long, default_value_t = weir_dataplane::proxy::accesslog::QUEUE as u64, value_name = "LINES", value_parser = clap::value_parser!(u64).range(1..1 << 24))]
    pub access_log_queue: u64,
    /// Relay TCP service connections with splice(2), zero-copy (Linux); `false`: through a copy
    /// buffer (HAProxy's `nosplice`).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, value_name = "BOOL")]
    pub l4_splice: bool,
    /// The HTTP/1 server of client connections: weir (hyper per busy period: nothing held
    /// while a connection is idle), or hyper (its buffers kept for a connection's life).
    #[arg(long, default_value = "weir", env = "WEIR_HTTP1_SERVER", value_name = "hyper|weir", value_parser = parse_http1_server)]
    pub http1_server: weir_dataplane::proxy::Http1Server,
}

/// `--http1-server`.
fn parse_http1_server(s: &str) -> Result<weir_dataplane::proxy::Http1Server, String> {
    s.parse()
}

/// `--access-log`.
fn parse_access_log(s: &str) -> Result<weir_dataplane::proxy::accesslog::Output, String> {
    s.parse()
}

/// Metric names `--metrics-compat` adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsCompat {
    /// `nginx_ingress_controller_*`, with `controller_class`, `controller_namespace` and
    /// `controller_pod`.
    IngressNginx,
}

/// Flags of the Kubernetes API source, status writer and leader election.
#[derive(Debug, Args)]
pub struct KubeArgs {
    /// Kubeconfig file (default: in-cluster configuration, else $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE", conflicts_with = "manifests")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace to watch (repeatable; default: all namespaces).
    #[arg(long = "watch-namespace", value_name = "NS")]
    pub watch_namespaces: Vec<String>,
    /// Translate a change once no other change arrived for this long (milliseconds).
    #[arg(long, default_value_t = 100, value_name = "MS")]
    pub sync_holdoff_ms: u64,
    /// ...or at the latest this long after the first change of a burst (milliseconds).
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub sync_max_delay_ms: u64,
    /// Service whose addresses go into the Ingresses' status (LoadBalancer ingress; node
    /// addresses for NodePort; the cluster IP otherwise).
    #[arg(long, value_name = "NS/NAME", value_parser = parse_object_ref)]
    pub publish_service: Option<ObjectRef>,
    /// Addresses written into the Ingresses' status when no --publish-service is given
    /// (repeatable or comma-separated).
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub publish_status_address: Vec<String>,
    /// Name of the coordination.k8s.io/v1 Lease that elects the status writer.
    #[arg(long, default_value = "weir-leader", value_name = "NAME")]
    pub election_id: String,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default", value_name = "NS")]
    pub election_namespace: String,
    /// How long the leader's Lease stays valid without renewal (seconds).
    #[arg(long, default_value_t = 15, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(2..))]
    pub election_lease_duration: u64,
    /// This replica's identity in the Lease (default: host name and process id).
    #[arg(long, env = "POD_NAME", value_name = "ID")]
    pub election_identity: Option<String>,
}

impl KubeArgs {
    /// The Kubernetes source settings these flags describe, watching `configmap` for settings.
    pub fn options(&self, controller_name: &str, configmap: Option<ObjectRef>) -> KubeServe {
        KubeServe {
            source: KubeOptions {
                kinds: Kinds::Ingress,
                kubeconfig: self.kubeconfig.clone(),
                namespaces: self.watch_namespaces.clone(),
                configmap,
                holdoff: Duration::from_millis(self.sync_holdoff_ms),
                max_delay: Duration::from_millis(self.sync_max_delay_ms.max(self.sync_holdoff_ms)),
                ..KubeOptions::default()
            },
            status: StatusOptions {
                publish_service: self.publish_service.clone(),
                publish_status_addresses: self.publish_status_address.clone(),
                lease: ObjectRef::new(&self.election_namespace, &self.election_id),
                lease_duration: Duration::from_secs(self.election_lease_duration),
                identity: self.election_identity.clone().unwrap_or_else(default_identity),
                controller_name: controller_name.to_string(),
                leader: Default::default(),
            },
        }
    }
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "weir".to_string());
    format!("{host}-{}", std::process::id())
}

/// `weir echo`.
#[derive(Debug, Args)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Name reported in every answer (to tell replicas apart).
    #[arg(long, default_value = "echo")]
    pub name: String,
}

impl ServeArgs {
    /// The in-process server options these flags describe.
    pub fn options(&self) -> ServeOptions {
        let config = self.source.translate_config();
        ServeOptions {
            manifests: self.source.manifests.clone().unwrap_or_default(),
            kube: match self.source.manifests {
                Some(_) => None,
                None => Some(self.kube.options(&config.controller_name, self.source.configmap.clone())).map(
                    |mut kube| {
                        kube.source.l4_config_maps =
                            config.tcp_services.iter().chain(&config.udp_services).cloned().collect();
                        kube
                    },
                ),
            },
            tcp_services: config.tcp_services.clone(),
            udp_services: config.udp_services.clone(),
            l4: weir_dataplane::l4::L4Config {
                listen: self.l4_listen_address,
                udp_max_flows: self.udp_max_flows as usize,
                zero_copy: self.l4_splice,
                threads: self
                    .threads
                    .map(usize::from)
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
                ..Default::default()
            },
            // In a cluster only a named ConfigMap is read.
            settings: match self.source.manifests {
                Some(_) => config.settings,
                None => self.source.configmap.clone(),
            },
            listen_http: self.listen_http,
            listen_https: Some(self.listen_https),
            listen_admin: self.listen_admin,
            ingress_class: config.ingress_class,
            controller_name: config.controller_name,
            watch_ingress_without_class: config.watch_ingress_without_class,
            default_certificate: config.default_certificate,
            default_certificate_files: self
                .default_certificate_file
                .clone()
                .zip(self.default_key_file.clone()),
            threads: self.threads.map(usize::from),
            listen_backlog: (self.listen_backlog > 0).then_some(self.listen_backlog),
            proxy: ProxyConfig {
                connection_limits: ConnLimitConfig {
                    max: self.connection_limit(open_file_limit()),
                    per_client: self.max_connections_per_client,
                },
                client_send_timeout: Duration::from_secs(self.client_send_timeout),
                https_redirect_port: self.https_redirect_port,
                proxy_protocol: self.proxy_protocol,
                hsts: self.hsts_max_age.map(|age| {
                    let sub = if self.hsts_include_subdomains { "; includeSubDomains" } else { "" };
                    http::HeaderValue::from_str(&format!("max-age={age}{sub}"))
                        .unwrap_or_else(|_| http::HeaderValue::from_static("max-age=0"))
                }),
                metrics: weir_dataplane::metrics::MetricsConfig {
                    enabled: self.metrics,
                    per_host: self.metrics_per_host,
                    max_hosts: self.metrics_max_hosts,
                },
                access_log_output: self.access_log.clone(),
                access_log_queue: self.access_log_queue as usize,
                http1_server: self.http1_server,
                ..ProxyConfig::default()
            },
            metrics: crate::metrics::MetricsOptions {
                ingress_nginx: self.metrics_compat.map(|MetricsCompat::IngressNginx| {
                    crate::metrics::Compat {
                        class: self.source.translate_config().ingress_class,
                        namespace: self.kube.election_namespace.clone(),
                        pod: self.kube.election_identity.clone().unwrap_or_else(default_identity),
                    }
                }),
            },
            gateway: config.gateway,
            ..ServeOptions::default()
        }
    }
}

impl ServeArgs {
    /// `--max-connections`, or the connections `nofile` open files allow; warns when an explicit
    /// limit needs more descriptors than the process may open.
    fn connection_limit(&self, nofile: u64) -> usize {
        let fits = limits::connections_for_fd_limit(nofile);
        if self.max_connections == 0 {
            return fits;
        }
        if self.max_connections > fits {
            tracing::warn!(
                max_connections = self.max_connections,
                open_file_limit = nofile,
                fits,
                "--max-connections is more than the open-file limit allows (two descriptors per connection): past {fits} connections accepts may fail with EMFILE and weir backs off; raise the limit (ulimit -n) or lower --max-connections"
            );
        }
        self.max_connections
    }
}

/// Raises the soft open-file limit to the hard one (as Go programs and nginx's
/// `worker_rlimit_nofile` do; the soft limit is often 1024 for compatibility with `select`, which
/// weir does not use) and returns the soft limit in force.
pub fn raise_open_file_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if let (Some(current), maximum) = (limit.current, limit.maximum)
        && maximum.is_none_or(|max| max > current)
    {
        // An unlimited hard limit: the kernel caps open files at fs.nr_open.
        let target = maximum.unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(1 << 20)
        });
        if let Err(error) = setrlimit(Resource::Nofile, Rlimit { current: Some(target), maximum }) {
            tracing::debug!(%error, "cannot raise the open-file limit");
        }
    }
    open_file_limit()
}

/// The soft open-file limit in force (`u64::MAX`: unlimited).
fn open_file_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Runs `weir serve` until SIGTERM/Ctrl-C.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let nofile = raise_open_file_limit();
    let options = args.options();
    let limits = options.proxy.connection_limits;
    tracing::info!(
        open_file_limit = nofile,
        max_connections = limits.max,
        max_connections_per_client = limits.per_client,
        "connection limits"
    );
    let running = Running::start(options).await?;
    running.run_until_signal().await;
    Ok(())
}

/// Runs `weir echo` until SIGTERM/Ctrl-C.
pub async fn echo(args: EchoArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, name = %args.name, "echo backend serving");
    weir_dataplane::echo::serve(listener, args.name, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

/// The log filter for `spec` (`--log-level` or RUST_LOG): rustls at `error` unless `spec` names
/// it. rustls warns once per connection about what a client sent (an IP address as SNI, for
/// one): at the default level any client could fill the log.
pub fn log_filter(spec: &str) -> String {
    if spec.contains("rustls") { spec.to_string() } else { format!("{spec},rustls=error") }
}

/// Loads and translates a manifest directory once; returns the translation and file errors.
pub fn load(args: &SourceArgs) -> anyhow::Result<(Translation, Vec<String>)> {
    let Some(manifests) = &args.manifests else { anyhow::bail!("--manifests DIR is required") };
    let mut dir = ManifestDir::new(manifests);
    dir.rescan(true)?;
    let (snapshot, duplicates) = dir.snapshot();
    let mut problems: Vec<String> = dir.errors().iter().map(|e| e.to_string()).collect();
    problems.extend(duplicates);
    Ok((translate::translate(&snapshot, &args.translate_config()), problems))
}

/// `weir check`: prints file errors and translation warnings; failure if any is an error.
pub fn check(args: &SourceArgs, out: &mut impl std::io::Write) -> anyhow::Result<ExitCode> {
    let (translation, file_problems) = load(args)?;
    let mut errors = 0usize;
    for problem in &file_problems {
        writeln!(out, "error: {problem}")?;
        errors += 1;
    }
    for warning in &translation.warnings {
        let level = match warning.severity {
            Severity::Error => {
                errors += 1;
                "error"
            }
            Severity::Warning => "warning",
        };
        writeln!(out, "{level}: {warning}")?;
    }
    let routes: usize = translation.table.hosts.iter().map(|h| h.routes.len()).sum();
    writeln!(
        out,
        "{}: {} ingresses, {} hosts, {} routes, {} backends; {} errors, {} warnings",
        args.manifests.as_deref().map(display).unwrap_or_default(),
        translation.ingresses.len(),
        translation.table.hosts.len(),
        routes,
        translation.table.backends.len(),
        errors,
        file_problems.len() + translation.warnings.len() - errors,
    )?;
    Ok(if errors > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// `weir dump`: prints the routing table as YAML (warnings go to the log, on stderr).
pub fn dump(args: &SourceArgs, out: &mut impl std::io::Write) -> anyhow::Result<ExitCode> {
    let (translation, file_problems) = load(args)?;
    for problem in &file_problems {
        tracing::warn!("{problem}");
    }
    for warning in &translation.warnings {
        tracing::warn!("{warning}");
    }
    let yaml = serde_saphyr::to_string(&translation.table)?;
    out.write_all(yaml.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
