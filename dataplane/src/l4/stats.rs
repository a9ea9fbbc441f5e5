//! Counters of one L4 service, kept across table swaps while its port stays in the table.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// What one L4 service has done since its port was first served.
#[derive(Debug, Default)]
pub struct Stats {
    /// TCP connections accepted (admitted), or UDP flows started.
    pub(crate) opened: AtomicU64,
    /// TCP connections or UDP flows open now.
    pub(crate) open: AtomicU64,
    /// Bytes from clients to upstreams (UDP: datagram payloads).
    pub(crate) bytes_up: AtomicU64,
    /// Bytes from upstreams to clients.
    pub(crate) bytes_down: AtomicU64,
    /// Upstream connects that failed or timed out (TCP), or flows with no usable endpoint.
    pub(crate) connect_errors: AtomicU64,
    /// UDP flows evicted because the flow table was full (the oldest goes).
    pub(crate) evicted: AtomicU64,
    /// UDP datagrams dropped (a full socket buffer towards the upstream).
    pub(crate) dropped: AtomicU64,
    /// TCP connections with a direction relayed with splice(2) (zero-copy) once its reads filled
    /// the copy buffer.
    pub(crate) spliced: AtomicU64,
}

/// A copy of [`Stats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// TCP connections accepted, or UDP flows started.
    pub opened: u64,
    /// TCP connections or UDP flows open now.
    pub open: u64,
    /// Bytes from clients to upstreams.
    pub bytes_up: u64,
    /// Bytes from upstreams to clients.
    pub bytes_down: u64,
    /// Failed upstream connects (TCP) or flows without an endpoint.
    pub connect_errors: u64,
    /// UDP flows evicted from a full flow table.
    pub evicted: u64,
    /// UDP datagrams dropped.
    pub dropped: u64,
    /// TCP connections relayed with splice(2).
    pub spliced: u64,
}

impl Stats {
    /// The counts now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            opened: self.opened.load(Relaxed),
            open: self.open.load(Relaxed),
            bytes_up: self.bytes_up.load(Relaxed),
            bytes_down: self.bytes_down.load(Relaxed),
            connect_errors: self.connect_errors.load(Relaxed),
            evicted: self.evicted.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            spliced: self.spliced.load(Relaxed),
        }
    }

    /// Counts a connection or flow opened; the guard counts it closed when dropped.
    pub(crate) fn open(self: &std::sync::Arc<Self>) -> OpenGuard {
        self.opened.fetch_add(1, Relaxed);
        self.open.fetch_add(1, Relaxed);
        OpenGuard(self.clone())
    }
}

/// One open connection or flow of a service.
#[derive(Debug)]
pub(crate) struct OpenGuard(std::sync::Arc<Stats>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// Milliseconds since `base` (the relay's activity time stamp; UDP flows use it too).
pub(crate) use crate::relay::millis;

/// Where one direction counts its bytes and marks activity.
pub(crate) struct Meter<'a> {
    /// The last transfer of either direction, in ms after `base` (the idle timeout's clock).
    pub(crate) activity: &'a AtomicU64,
    pub(crate) base: Instant,
    /// The service's counter and the connection's.
    pub(crate) bytes: [&'a AtomicU64; 2],
}

impl Meter<'_> {
    /// Counts `n` bytes moved, now.
    pub(crate) fn moved(&self, n: usize) {
        for counter in self.bytes {
            counter.fetch_add(n as u64, Relaxed);
        }
        self.activity.store(millis(self.base), Relaxed);
    }
}
