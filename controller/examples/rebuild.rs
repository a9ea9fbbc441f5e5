//! Per-phase timings of rebuilds over a manifest directory, without the server: read + parse,
//! then full rebuilds (translate everything, compile everything) and one-Ingress edits
//! (incremental translate, compile of the changed host). A profiling aid for bench/scale:
//!
//! ```sh
//! cargo run --release -p weir --example rebuild -- DIR [ROUNDS]
//! ```

use std::time::Instant;

use weir::snapshot::Object;
use weir::source::files::ManifestDir;
use weir::translate::{TranslateConfig, Translator};
use weir_dataplane::proxy::{Proxy, ProxyConfig};

/// The binary's allocator (controller/src/main.rs), so timings and RSS are the server's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// This process's resident memory, from /proc (Linux), in MB.
fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse::<f64>().ok());
    kb.unwrap_or(0.0) / 1024.0
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or_else(|| anyhow::anyhow!("usage: rebuild DIR [ROUNDS]"))?;
    let rounds: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(5);
    let t = Instant::now();
    let mut source = ManifestDir::new(&dir);
    source.rescan(true)?;
    println!("read + parse: {:.1} ms, RSS {:.0} MB", ms(t), rss_mb());
    let config = TranslateConfig::default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _guard = rt.enter();
    let proxy = Proxy::new(ProxyConfig::default());
    let mut snapshot = source.current().clone();
    let mut translator = Translator::new();
    for round in 0..rounds {
        let t = Instant::now();
        let pure = weir::translate::translate(&snapshot, &config);
        let pure_ms = ms(t);
        drop(pure);
        println!("translate (the pure function, for comparison): {pure_ms:.1} ms");
        let t = Instant::now();
        translator.update(&snapshot, None, &config);
        let translate = ms(t);
        let t = Instant::now();
        proxy.publish_changes(&translator.translation().table, None)?;
        let publish = ms(t);
        let t = Instant::now();
        translator.prepare();
        let prepare = ms(t);
        let before = rss_mb();
        let t = Instant::now();
        weir::memory::release_free_memory();
        println!(
            "full {round}: translate {translate:.1} ms, compile + swap {publish:.1} ms, then indexes {prepare:.1} ms, RSS {before:.0} MB, free memory returned in {:.1} ms: RSS {:.0} MB",
            ms(t),
            rss_mb()
        );
    }
    let keys: Vec<_> = snapshot.ingresses.keys().cloned().collect();
    for (round, key) in keys.iter().step_by(keys.len().div_ceil(rounds.max(1))).enumerate() {
        let t = Instant::now();
        let mut ingress = snapshot.ingresses.get(key).cloned().unwrap_or_default();
        let rule = ingress.spec.as_mut().and_then(|s| s.rules.as_mut()).and_then(|r| r.first_mut());
        if let Some(path) = rule.and_then(|r| r.http.as_mut()).and_then(|h| h.paths.first_mut()) {
            path.path = Some(format!("/edited-{round}"));
        }
        snapshot.insert(Object::Ingress(Box::new(ingress)));
        let edit = ms(t);
        let t = Instant::now();
        let update =
            translator.update(&snapshot, Some(&[weir::snapshot::SnapshotKey::Ingress(key.clone())]), &config);
        let translate = ms(t);
        let t = Instant::now();
        proxy.publish_changes(&translator.translation().table, update.changes.as_ref())?;
        println!(
            "edit {round} ({key}): snapshot {edit:.2} ms, translate {translate:.2} ms ({} Ingresses), compile + swap {:.2} ms",
            update.translated,
            ms(t)
        );
    }
    println!("RSS at the end {:.0} MB", rss_mb());
    // Exit without freeing: what a heap profiler (heaptrack) reports as leaked is then what a
    // server with this table holds.
    std::process::exit(0)
}
