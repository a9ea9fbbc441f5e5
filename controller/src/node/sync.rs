//! The sync loop: applies the newest [`Ruleset`] through a [`Backend`], rate-limited, with a
//! periodic resync and retries after failures.
//!
//! - A new ruleset is applied at once unless the previous sync was less than
//!   `min_sync_interval` ago; then it waits for the rest of the interval (bursts coalesce).
//! - Every `sync_period` the backend re-checks its hooks and syncs (writing nothing when nothing
//!   changed); every `full_sync_period`, and after a failure, it rewrites everything.
//! - A failed sync is logged and retried after `min_sync_interval`, doubling up to
//!   `sync_period`.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;

use super::plan::Ruleset;

/// What one backend sync reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Whether anything was written to the kernel.
    pub written: bool,
    /// Rules written.
    pub rules_written: usize,
    /// Rules weir has in the kernel after the sync.
    pub rules_total: usize,
}

/// A way of programming the kernel (iptables, nftables, ipvs).
pub trait Backend: Send + 'static {
    /// The mode's name, for logs.
    fn name(&self) -> &'static str;
    /// Brings the kernel to `ruleset`; with `full`, rewrites everything weir owns.
    fn sync(&mut self, ruleset: &Arc<Ruleset>, full: bool) -> anyhow::Result<Report>;
    /// Re-checks what lies outside weir's own objects (jumps from built-in chains); returns
    /// whether something had to be repaired.
    fn repair(&mut self) -> anyhow::Result<bool> {
        Ok(false)
    }
}

// The sync loop takes any backend, boxed or not.
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn sync(&mut self, ruleset: &Arc<Ruleset>, full: bool) -> anyhow::Result<Report> {
        (**self).sync(ruleset, full)
    }

    fn repair(&mut self) -> anyhow::Result<bool> {
        (**self).repair()
    }
}

/// Timing of the sync loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Periodic resync.
    pub sync_period: Duration,
    /// Minimum time between two syncs.
    pub min_sync_interval: Duration,
    /// Period of full rewrites.
    pub full_sync_period: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sync_period: Duration::from_secs(30),
            min_sync_interval: Duration::from_secs(1),
            full_sync_period: Duration::from_secs(3600),
        }
    }
}

/// Metrics of the loop (`weir_node_*` once registered), shared with whoever serves them.
#[derive(Debug)]
pub struct Stats {
    /// Successful syncs.
    pub syncs: Counter,
    /// Failed syncs (each is retried).
    pub failures: Counter,
    /// Failed syncs since the last successful one (0 when the last sync succeeded).
    pub consecutive_failures: Gauge,
    /// Syncs that wrote something.
    pub writes: Counter,
    /// Rules (or nft commands) written.
    pub rules_written: Counter,
    /// Rules weir has in the kernel.
    pub rules: Gauge,
    /// Unix time of the last successful sync, in seconds.
    pub last_sync_timestamp: Gauge<f64, AtomicU64>,
    /// Duration of syncs, in seconds.
    pub sync_duration: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            syncs: Counter::default(),
            failures: Counter::default(),
            consecutive_failures: Gauge::default(),
            writes: Counter::default(),
            rules_written: Counter::default(),
            rules: Gauge::default(),
            last_sync_timestamp: Gauge::default(),
            sync_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        }
    }
}

impl Stats {
    /// Registers every metric in `registry` under the `node` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("node");
        r.register("syncs", "Successful rule syncs", self.syncs.clone());
        r.register("sync_failures", "Failed rule syncs (retried)", self.failures.clone());
        r.register(
            "sync_consecutive_failures",
            "Failed rule syncs since the last successful one",
            self.consecutive_failures.clone(),
        );
        r.register("sync_writes", "Rule syncs that wrote to the kernel", self.writes.clone());
        r.register("rules_written", "Rules or nft commands written", self.rules_written.clone());
        r.register("rules", "Rules weir node has in the kernel", self.rules.clone());
        r.register(
            "last_sync_timestamp_seconds",
            "Unix time of the last successful sync",
            self.last_sync_timestamp.clone(),
        );
        r.register("sync_duration_seconds", "Duration of rule syncs", self.sync_duration.clone());
    }
}

/// Runs the loop until `rulesets` is closed. The first sync waits for the first ruleset
/// (the source must not publish before it has read everything).
pub async fn run<B: Backend>(
    backend: B,
    mut rulesets: watch::Receiver<Option<Arc<Ruleset>>>,
    options: Options,
    stats: Arc<Stats>,
) -> anyhow::Result<()> {
    let mut backend = Some(backend);
    let mut dirty = true;
    let mut need_full = true;
    let mut last_sync: Option<Instant> = None;
    let mut last_full = Instant::now();
    let mut next_periodic = Instant::now() + options.sync_period;
    let mut backoff = options.min_sync_interval;
    let mut retry_at: Option<Instant> = None;
    let mut open = true;
    loop {
        let ruleset = rulesets.borrow_and_update().clone();
        let now = Instant::now();
        let earliest = last_sync.map_or(now, |t| t + options.min_sync_interval).max(retry_at.unwrap_or(now));
        let due = ruleset.is_some() && ((dirty && now >= earliest) || now >= next_periodic);
        if due && let Some(ruleset) = ruleset {
            let periodic = now >= next_periodic;
            let full = need_full || now.duration_since(last_full) >= options.full_sync_period;
            let Some(mut b) = backend.take() else { anyhow::bail!("backend lost by a panicked sync") };
            let started = std::time::Instant::now();
            let (b, result, full) = tokio::task::spawn_blocking(move || {
                let mut repaired = Ok(false);
                if periodic && !full {
                    repaired = b.repair();
                }
                match repaired {
                    // Something outside weir's objects was off: rewrite everything.
                    Ok(repaired) => {
                        let full = full || repaired;
                        let result = b.sync(&ruleset, full);
                        (b, result, full)
                    }
                    Err(e) => (b, Err(e), full),
                }
            })
            .await?;
            backend = Some(b);
            last_sync = Some(Instant::now());
            next_periodic = Instant::now() + options.sync_period;
            match result {
                Ok(report) => {
                    stats.syncs.inc();
                    stats.consecutive_failures.set(0);
                    stats.sync_duration.observe(started.elapsed().as_secs_f64());
                    stats.rules.set(i64::try_from(report.rules_total).unwrap_or(i64::MAX));
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                    stats.last_sync_timestamp.set(now.map_or(0.0, |d| d.as_secs_f64()));
                    if report.written {
                        stats.writes.inc();
                        stats.rules_written.inc_by(report.rules_written as u64);
                        tracing::info!(
                            full,
                            rules_written = report.rules_written,
                            rules_total = report.rules_total,
                            elapsed_ms = started.elapsed().as_millis() as u64,
                            "node rules synced"
                        );
                    }
                    dirty = false;
                    need_full = false;
                    retry_at = None;
                    backoff = options.min_sync_interval;
                    if full {
                        last_full = Instant::now();
                    }
                }
                Err(error) => {
                    stats.failures.inc();
                    stats.consecutive_failures.inc();
                    tracing::error!(error = format!("{error:#}"), retry_in = ?backoff, "node rules sync failed; retrying");
                    dirty = true;
                    need_full = true;
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(options.sync_period).max(Duration::from_millis(1));
                }
            }
            continue;
        }
        if !open {
            return Ok(());
        }
        let wake = if dirty && ruleset.is_some() { earliest.min(next_periodic) } else { next_periodic };
        tokio::select! {
            changed = rulesets.changed() => match changed {
                Ok(()) => dirty = true,
                Err(_) => {
                    // The source is gone: apply what is pending, then stop.
                    open = false;
                    if !dirty {
                        return Ok(());
                    }
                }
            },
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    #[derive(Clone, Default)]
    struct Fake {
        calls: Arc<Mutex<Vec<(usize, bool, Instant)>>>,
        fail_first: Arc<std::sync::atomic::AtomicU64>,
    }

    impl Backend for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }

        fn sync(&mut self, ruleset: &Arc<Ruleset>, full: bool) -> anyhow::Result<Report> {
            self.calls.lock().unwrap().push((ruleset.warnings.len(), full, Instant::now()));
            if self.fail_first.load(Relaxed) > 0 {
                self.fail_first.fetch_sub(1, Relaxed);
                anyhow::bail!("iptables-restore: resource busy");
            }
            Ok(Report { written: true, ..Report::default() })
        }
    }

    fn ruleset(n: usize) -> Option<Arc<Ruleset>> {
        let mut r = Ruleset::default();
        for i in 0..n {
            r.warnings.push(crate::node::plan::PlanWarning {
                object: weir_dataplane::model::ObjectRef::new("ns", format!("s{i}")),
                reason: String::new(),
            });
        }
        Some(Arc::new(r))
    }

    #[tokio::test]
    async fn bursts_are_rate_limited_and_failures_retried() {
        let fake = Fake::default();
        fake.fail_first.store(1, Relaxed);
        let (tx, rx) = watch::channel(None);
        let options = Options {
            sync_period: Duration::from_secs(60),
            min_sync_interval: Duration::from_millis(200),
            full_sync_period: Duration::from_secs(3600),
        };
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn(run(fake.clone(), rx, options, stats.clone()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(fake.calls.lock().unwrap().is_empty(), "no sync before the first ruleset");
        tx.send(ruleset(1)).unwrap();
        // First attempt fails, the retry (a full sync) comes after min_sync_interval.
        tokio::time::sleep(Duration::from_millis(350)).await;
        {
            let calls = fake.calls.lock().unwrap();
            assert_eq!(calls.len(), 2, "{calls:?}");
            assert!(calls[0].1 && calls[1].1, "first sync and retry are full");
            assert!(calls[1].2 - calls[0].2 >= Duration::from_millis(190));
        }
        // A burst of 10 updates within the interval makes at most two syncs.
        for i in 2..12 {
            tx.send(ruleset(i)).unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        let calls = fake.calls.lock().unwrap().clone();
        assert!(calls.len() <= 4, "{calls:?}");
        assert!(!calls.last().unwrap().1, "partial syncs after a success");
        assert_eq!(calls.last().unwrap().0, 11, "the newest ruleset is applied: {calls:?}");
        for pair in calls.windows(2) {
            assert!(pair[1].2 - pair[0].2 >= Duration::from_millis(190), "{calls:?}");
        }
        assert_eq!(stats.failures.get(), 1);
        let mut registry = Registry::default();
        stats.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("node_sync_failures_total 1"), "{text}");
        drop(tx);
        task.await.unwrap().unwrap();
    }
}
