//! `weir-soak`: the soak benchmark's load driver and gRPC backend (see bench/README.md).
//!
//! - `weir-soak load`: keeps h1 (keep-alive and new connections), TLS h1, h2 over TLS,
//!   WebSocket sessions and gRPC (unary and bidirectional streams) running through weir at a
//!   moderate fixed pace, and writes what it saw per interval and every error with its time.
//! - `weir-soak grpc-server`: a gRPC backend (h2c) whose answers name it.
//!
//! A Rust driver rather than wrk/h2load/python: one client that classifies every failure with
//! a timestamp (so the orchestrator can attribute it to an injected fault), speaks gRPC without
//! protoc, and uses only crates the workspace already builds.

mod clients;
mod grpc;
mod stats;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use clients::Target;
use stats::{Proto, Recorder};

#[derive(Parser)]
#[command(about = "The soak benchmark's load driver and gRPC backend")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Keep mixed load running through weir and record what the clients see.
    Load(LoadArgs),
    /// Serve the soak's gRPC service over h2c.
    GrpcServer {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// The name answers carry (grpc-N).
        #[arg(long)]
        name: String,
    },
}

#[derive(clap::Args)]
struct LoadArgs {
    /// weir's plain HTTP listener.
    #[arg(long)]
    http: SocketAddr,
    /// weir's HTTPS listener.
    #[arg(long)]
    https: SocketAddr,
    /// PEM file of the CA that signs weir's certificates.
    #[arg(long)]
    ca: PathBuf,
    /// How long to run, in seconds.
    #[arg(long)]
    seconds: u64,
    /// Seconds per reported interval.
    #[arg(long, default_value_t = 10.0)]
    interval: f64,
    /// Directory for intervals.jsonl, errors.jsonl and summary.json.
    #[arg(long)]
    out: PathBuf,
    /// Multiplies every client's pace (1: about 160 requests/s in all).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match cli.command {
        Command::GrpcServer { listen, name } => runtime.block_on(grpc::serve(listen, name)),
        Command::Load(args) => runtime.block_on(load(args)),
    }
}

/// The TLS client settings: trust the soak CA only, never resume a session.
fn tls_config(ca: &std::path::Path) -> anyhow::Result<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.with_context(|| format!("parsing {}", ca.display()))?)?;
    }
    anyhow::ensure!(!roots.is_empty(), "no certificate in {}", ca.display());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

async fn load(args: LoadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.scale > 0.0 && args.scale.is_finite(), "--scale must be positive");
    anyhow::ensure!(args.interval >= 0.1 && args.interval.is_finite(), "--interval must be at least 0.1 s");
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let rec: &'static Recorder = Box::leak(Box::new(Recorder::create(&args.out)?));
    let target =
        Arc::new(Target { http: args.http, https: args.https, tls: Arc::new(tls_config(&args.ca)?) });
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let period = |per_second: f64| Duration::from_secs_f64(1.0 / (per_second * args.scale));

    let mut workers = tokio::task::JoinSet::new();
    // h1 keep-alive: 4 connections x 10/s to web.
    for _ in 0..4 {
        workers.spawn(clients::h1_keepalive(
            target.clone(),
            rec,
            Proto::H1,
            "web.soak.test",
            period(10.0),
            1000,
            stop.clone(),
        ));
    }
    // h1, a new connection per request: 10/s to api (the Service whose endpoints churn).
    workers.spawn(clients::h1_new_connections(
        target.clone(),
        rec,
        "api.soak.test",
        period(10.0),
        stop.clone(),
    ));
    // TLS h1: 2 connections x 10/s to api, a new handshake every 50 requests.
    for _ in 0..2 {
        workers.spawn(clients::h1_keepalive(
            target.clone(),
            rec,
            Proto::H1Tls,
            "api.soak.test",
            period(10.0),
            50,
            stop.clone(),
        ));
    }
    // h2 over TLS: 2 connections, 4 streams at a time, 5 rounds/s (40/s), a new one every 100 rounds.
    for _ in 0..2 {
        workers.spawn(clients::h2_tls(
            target.clone(),
            rec,
            "web.soak.test",
            period(5.0),
            4,
            100,
            stop.clone(),
        ));
    }
    // WebSocket: 2 sessions at a time, 20 echoes at 10/s each, then close and reopen.
    for worker in 0..2 {
        workers.spawn(clients::websocket(
            target.clone(),
            rec,
            "web.soak.test",
            period(10.0),
            20,
            worker,
            stop.clone(),
        ));
    }
    // gRPC over TLS: unary at 20/s; 1 bidi stream at a time of 20 messages at 10/s.
    let unary = grpc::channel(target.clone(), rec, Proto::GrpcUnary, "grpc.soak.test")?;
    workers.spawn(grpc::unary(unary, rec, period(20.0), stop.clone()));
    let streaming = grpc::channel(target.clone(), rec, Proto::GrpcStream, "grpc.soak.test")?;
    workers.spawn(grpc::streams(streaming, rec, period(10.0), 20, stop.clone()));

    let interval = Duration::from_secs_f64(args.interval);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    let end = tokio::time::Instant::now() + Duration::from_secs(args.seconds);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            _ = ticks.tick() => rec.flush_interval(),
        }
    }
    let _ = stop_tx.send(true);
    // Workers stop at their next tick; give in-flight exchanges their timeout to finish.
    let _ = tokio::time::timeout(clients::TIMEOUT + Duration::from_secs(1), async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    rec.flush_interval();
    let summary = rec.summary();
    let path = args.out.join("summary.json");
    std::fs::write(&path, format!("{summary:#}\n")).with_context(|| format!("writing {}", path.display()))?;
    println!("{summary}");
    Ok(())
}
