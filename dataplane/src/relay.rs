//! The bounded copy relay of a byte stream both ways, ended when both directions are done, a
//! side fails, or nothing moved for an idle timeout, for TLS connections terminated here and
//! relayed as plain TCP (Gateway API TLSRoute on a `Terminate` listener, `proxy::server`); its
//! idle timer is shared with L4 TCP services (`l4::tcp`, which relay plain sockets with their
//! own `l4::pump`: reads that drain a socket are known without an extra `recv`, and bulk
//! transfers turn to splice(2)).
//!
//! Each direction reads into one buffer of its own and writes it out before reading again, so
//! a connection holds at most two buffers whatever its peers do; the end of a source is passed
//! on as a half-close (`shutdown`) of its destination. One timer, moved later by every copy,
//! keeps the idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Sleep;

/// Milliseconds since `base`: an activity time stamp that fits an atomic (connections and UDP
/// flows compare it against their idle timeout).
pub(crate) fn millis(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The error of a relay that went idle for `idle` (`proxy-stream-timeout`).
pub(crate) fn idle_error(idle: Duration) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("idle for {idle:?} (proxy-stream-timeout)"))
}

/// One side of a relay: its read half and its write half.
pub(crate) struct Side<R, W> {
    /// Where this side's bytes come from.
    pub(crate) read: R,
    /// Where bytes for this side go.
    pub(crate) write: W,
}

/// Copies `client` → `upstream` and back, each direction through one buffer of `buffer` bytes
/// (at least 1 KiB), counting the bytes in `up` and `down`, until both directions reached end
/// of stream, a side failed, or nothing moved for `idle` (`timer`, the connection's, keeps
/// it: an [`idle_error`]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn copy<CR, CW, UR, UW>(
    client: Side<CR, CW>,
    upstream: Side<UR, UW>,
    idle: Duration,
    buffer: usize,
    up: &[&AtomicU64],
    down: &[&AtomicU64],
    timer: Pin<&mut Sleep>,
) -> io::Result<()>
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    UR: AsyncRead + Unpin,
    UW: AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = (client.read, client.write);
    let (mut upstream_read, mut upstream_write) = (upstream.read, upstream.write);
    let base = Instant::now();
    let activity = AtomicU64::new(0);
    let to_upstream = pump(&mut client_read, &mut upstream_write, buffer, &activity, base, up);
    let to_client = pump(&mut upstream_read, &mut client_write, buffer, &activity, base, down);
    tokio::select! {
        biased;
        done = async { tokio::try_join!(to_upstream, to_client) } => done.map(|_| ()),
        () = idle_for(idle, &activity, base, timer) => Err(idle_error(idle)),
    }
}

/// Copies `from` into `to` through one buffer of `size` bytes, counting in `bytes`; at the end
/// of `from`, shuts `to`'s write side (the half-close passed on).
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    size: usize,
    activity: &AtomicU64,
    base: Instant,
    bytes: &[&AtomicU64],
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; size.max(1024)];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        for counter in bytes {
            counter.fetch_add(n as u64, Relaxed);
        }
        activity.store(millis(base), Relaxed);
    }
}

/// Resolves once nothing was copied for `idle` (`activity`: the last copy, in ms after `base`),
/// with `timer` set to `idle` after the last copy seen (moved later, which costs no timer-wheel
/// work until it comes due, as each copy pushes it).
pub(crate) async fn idle_for(
    idle: Duration,
    activity: &AtomicU64,
    base: Instant,
    mut timer: Pin<&mut Sleep>,
) {
    let mut last = activity.load(Relaxed);
    loop {
        timer.as_mut().reset(tokio::time::Instant::from_std(base + Duration::from_millis(last) + idle));
        timer.as_mut().await;
        // Due: `idle` passed since `last`; nothing new since then means idle.
        let now = activity.load(Relaxed);
        if now == last {
            return;
        }
        last = now;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Bytes go both ways and are counted; each end of stream is passed on as a half-close, and
    /// the relay ends when both directions have ended.
    #[tokio::test]
    async fn copies_both_ways_and_passes_half_closes_on() {
        let (mut client, near) = tokio::io::duplex(64);
        let (far, mut backend) = tokio::io::duplex(64);
        let (near_read, near_write) = tokio::io::split(near);
        let (far_read, far_write) = tokio::io::split(far);
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let relay = async {
            let timer = std::pin::pin!(tokio::time::sleep(Duration::from_secs(3600)));
            copy(
                Side { read: near_read, write: near_write },
                Side { read: far_read, write: far_write },
                Duration::from_secs(3600),
                16,
                &[&up],
                &[&down],
                timer,
            )
            .await
        };
        let peers = async {
            client.write_all(b"hello").await.unwrap();
            client.shutdown().await.unwrap();
            let mut got = Vec::new();
            backend.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"hello");
            backend.write_all(b"world!").await.unwrap();
            backend.shutdown().await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"world!");
        };
        let (relayed, ()) = tokio::join!(relay, peers);
        relayed.unwrap();
        assert_eq!((up.load(Relaxed), down.load(Relaxed)), (5, 6));
    }

    /// A relay where nothing moves ends with the idle error (paused clock: no real wait).
    #[tokio::test(start_paused = true)]
    async fn ends_when_idle() {
        let (_client, near) = tokio::io::duplex(64);
        let (far, _backend) = tokio::io::duplex(64);
        let (near_read, near_write) = tokio::io::split(near);
        let (far_read, far_write) = tokio::io::split(far);
        let timer = std::pin::pin!(tokio::time::sleep(Duration::from_secs(3600)));
        let err = copy(
            Side { read: near_read, write: near_write },
            Side { read: far_read, write: far_write },
            Duration::from_secs(30),
            16,
            &[],
            &[],
            timer,
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
