//! The `weir` binary.

use std::process::ExitCode;

use clap::Parser;
use weir::cli::{self, Cli, Command};

/// mimalloc instead of glibc's malloc: cheaper allocations on the request path (a task and
/// buffers per HTTP/2 stream), and freed memory goes back to the system instead of staying in
/// one glibc arena per thread after each table rebuild (bench/RESULTS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let spec =
        std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| cli.log_level.clone());
    if let Err(error) = weir::logging::init(&spec) {
        eprintln!("weir: invalid log filter {spec:?} (--log-level or RUST_LOG): {error}");
        return ExitCode::from(2);
    }

    let result = match cli.command {
        Command::Check(args) => cli::check(&args, &mut std::io::stdout().lock()),
        Command::Dump(args) => cli::dump(&args, &mut std::io::stdout().lock()),
        Command::Serve(args) => {
            if !args.transparent_huge_pages {
                weir::memory::disable_transparent_huge_pages();
            }
            let threads = args.threads.map(usize::from);
            runtime(threads).and_then(|rt| rt.block_on(cli::serve(*args))).map(|()| ExitCode::SUCCESS)
        }
        Command::Node(args) => runtime(Some(1))
            .and_then(|rt| rt.block_on(weir::node_agent::run(args)))
            .map(|()| ExitCode::SUCCESS),
        Command::Echo(args) => {
            runtime(Some(1)).and_then(|rt| rt.block_on(cli::echo(args))).map(|()| ExitCode::SUCCESS)
        }
        Command::Migrate(args) => weir::migrate::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("weir: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The proxy's runtime. `--threads 1` is a single-threaded runtime that runs every task on the
/// main thread (nginx's one worker): no run queues shared between threads, no cross-thread
/// wake-ups, and the I/O driver polled by the same thread that runs the connections.
fn runtime(threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().thread_name("weir-worker");
    Ok(builder.build()?)
}
