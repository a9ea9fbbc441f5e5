//! Per-phase timings of a rebuild over a manifest directory, without the server: read + parse,
//! snapshot, translate, compile, publish (compile + balancers + swap). A profiling aid for
//! bench/scale (`cargo run --release -p weir --example rebuild -- DIR [ROUNDS]`).

use std::time::Instant;

use weir::source::files::ManifestDir;
use weir::translate::{self, TranslateConfig};
use weir_dataplane::proxy::{Proxy, ProxyConfig};
use weir_dataplane::router::Router;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or_else(|| anyhow::anyhow!("usage: rebuild DIR [ROUNDS]"))?;
    let rounds: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(5);
    let t = Instant::now();
    let mut source = ManifestDir::new(&dir);
    source.rescan(true)?;
    println!("read + parse: {:.1} ms", ms(t));
    let config = TranslateConfig::default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _guard = rt.enter();
    let proxy = Proxy::new(ProxyConfig::default());
    for round in 0..rounds {
        let t = Instant::now();
        let snapshot = source.current().clone();
        let snap = ms(t);
        let t = Instant::now();
        let translation = translate::translate(&snapshot, &config);
        let tr = ms(t);
        let t = Instant::now();
        let copy = translation.table.clone();
        let clone_ms = ms(t);
        let t = Instant::now();
        let same = copy == translation.table;
        let eq_ms = ms(t);
        let t = Instant::now();
        drop(copy);
        println!("table clone {clone_ms:.1} ms, eq {eq_ms:.1} ms ({same}), drop {:.1} ms", ms(t));
        let t = Instant::now();
        let router = Router::compile(&translation.table)?;
        let compile = ms(t);
        drop(router);
        let t = Instant::now();
        proxy.publish(translation.table)?;
        let publish = ms(t);
        let t = Instant::now();
        drop(snapshot);
        let dropped = ms(t);
        println!(
            "round {round}: snapshot {snap:.1} ms, translate {tr:.1} ms, compile {compile:.1} ms, publish {publish:.1} ms, drop snapshot {dropped:.1} ms"
        );
    }
    Ok(())
}
