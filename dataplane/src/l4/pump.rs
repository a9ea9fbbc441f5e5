//! One direction of a TCP service connection (`tcp`): bytes from one socket to the other, copied
//! through a buffer while they come in reads that do not fill it, moved with splice(2) once a
//! read fills it (HAProxy's `splice-auto`: a short exchange never pays for a pipe, a bulk
//! transfer is not copied through weir's memory).
//!
//! The copy follows nginx's rule for edge-triggered readiness: a `recv` that returns less than
//! it was offered drained the socket, so the read readiness is cleared then and there instead of
//! being found out by one more `recv` failing with `EAGAIN` (one system call less per read).
//! That is sound: new bytes arriving after the `recv` raise a new edge, which sets the
//! readiness again (tokio clears only the readiness it saw, by its tick), and the end of stream
//! or a reset stays readable (`try_io` never clears the closed states), so the `recv` that
//! returns it is still made.
//!
//! Bytes are read into a buffer of the thread's and written on at once; only what the
//! destination does not take then is copied out, into a buffer of the direction's own, and
//! written as the destination becomes writable before the source is read again. A connection
//! that keeps up holds no buffer, an idle one none (its splicing directions hold empty pipes
//! only), and a slow destination holds back its source's reads (TCP flow control): at most one
//! buffer per direction.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::stats::Meter;
use crate::proxy::limits::ConnGuard;

/// The pipes both directions of a connection may turn to, counted against the connection
/// limit by its guard (behind a lock only for `Sync`: the connection's one task takes it, at
/// most once per direction).
pub(crate) struct Splicing<'a> {
    admission: Mutex<&'a mut ConnGuard>,
    /// The service's count of spliced connections.
    spliced: &'a AtomicU64,
}

impl<'a> Splicing<'a> {
    pub(crate) fn new(admission: &'a mut ConnGuard, spliced: &'a AtomicU64) -> Splicing<'a> {
        Splicing { admission: Mutex::new(admission), spliced }
    }

    /// A pipe of `size` bytes for one direction, if the connection limit has room for its
    /// descriptors and one is to be had; `None`: the direction keeps copying. The connection's
    /// first pipe counts it spliced.
    #[cfg(target_os = "linux")]
    fn take(&self, size: usize) -> Option<super::splice::Lent> {
        let Ok(mut admission) = self.admission.lock() else { return None };
        if !admission.hold_pipe() {
            tracing::debug!("L4 direction copied: the connection limit has no room for a pipe");
            return None;
        }
        match super::splice::Lent::take(size) {
            Ok(pipe) => {
                if admission.pipes() == 1 {
                    self.spliced.fetch_add(1, Relaxed);
                }
                Some(pipe)
            }
            Err(error) => {
                admission.release_pipe();
                tracing::debug!(%error, "L4 direction copied: no pipe for splice");
                None
            }
        }
    }
}

/// Relays `client` → `upstream` (metered by `up`) and back (`down`) until both directions
/// reached end of stream (each passed on as a half-close) or a side failed: each direction
/// copies through a buffer of `buffer` bytes (at least 1 KiB) and, with `splicing`, turns to
/// splice(2) after a read that fills it. The caller bounds it with the idle timeout.
pub(crate) async fn relay(
    client: &TcpStream,
    upstream: &TcpStream,
    buffer: usize,
    splicing: Option<&Splicing<'_>>,
    up: Meter<'_>,
    down: Meter<'_>,
) -> io::Result<()> {
    let size = buffer.max(1024);
    tokio::try_join!(pump(client, upstream, size, splicing, up), pump(upstream, client, size, splicing, down))
        .map(|_| ())
}

/// Moves `from` into `to` until `from` ends, then shuts `to`'s write side.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    size: usize,
    splicing: Option<&Splicing<'_>>,
    meter: Meter<'_>,
) -> io::Result<()> {
    loop {
        let (n, rest) = forward(from, to, size).await?;
        if n == 0 {
            return rustix::net::shutdown(to, rustix::net::Shutdown::Write).map_err(io::Error::from);
        }
        if !rest.is_empty() {
            write_all(to, &rest).await?;
        }
        meter.moved(n);
        if n < size {
            continue;
        }
        #[cfg(target_os = "linux")]
        if let Some(pipe) = splicing.and_then(|splicing| splicing.take(size)) {
            return super::splice::pump(from, to, pipe, &meter).await;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = splicing;
    }
}

thread_local! {
    /// The buffer a direction reads into on this thread: what it read is written on at once,
    /// and only what the destination did not take is copied out to be kept.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Once `from` is readable, reads what it has (up to `size` bytes; `0` at the end of stream)
/// and writes as much of it to `to` as `to` takes at once; returns the count read and what
/// `to` did not take (to be written as it becomes writable). A read shorter than `size` clears
/// the read readiness (drained, see the module's notes).
async fn forward(from: &TcpStream, to: &TcpStream, size: usize) -> io::Result<(usize, Vec<u8>)> {
    loop {
        std::future::poll_fn(|cx| from.poll_read_ready(cx)).await?;
        let step = SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => read_then_write(from, to, size, &mut scratch),
            // Not reached (no caller holds it across this call); a buffer of its own then.
            Err(_) => read_then_write(from, to, size, &mut Vec::new()),
        });
        if let Some(done) = step? {
            return Ok(done);
        }
    }
}

/// One read of `from` into `buf` (its whole capacity, at least `size` bytes) and the write of
/// it to `to` as far as `to` takes it without waiting; `None`: nothing to read after all (the
/// readiness was stale and is cleared).
fn read_then_write(
    from: &TcpStream,
    to: &TcpStream,
    size: usize,
    buf: &mut Vec<u8>,
) -> io::Result<Option<(usize, Vec<u8>)>> {
    buf.clear();
    if buf.capacity() < size {
        buf.reserve_exact(size);
    }
    let offered = buf.capacity();
    let read = from.try_io(Interest::READABLE, || {
        let (n, _) =
            rustix::net::recv(from, rustix::buffer::spare_capacity(buf), rustix::net::RecvFlags::empty())?;
        if n > 0 && n < offered {
            // Drained: the readiness is cleared with this `WouldBlock`; the bytes are in `buf`.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(())
    });
    match read {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::WouldBlock && buf.is_empty() => return Ok(None),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
        Err(error) => return Err(error),
    }
    let n = buf.len();
    let mut written = 0;
    while written < n {
        match send(to, &buf[written..n]) {
            Ok(m) => written += m,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) => return Err(error),
        }
    }
    Ok(Some((n, buf[written..n].to_vec())))
}

/// Writes all of `data` to `to`, waiting for it to be writable as needed.
async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        std::future::poll_fn(|cx| to.poll_write_ready(cx)).await?;
        match send(to, data) {
            Ok(n) => data = &data[n..],
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// One `send(2)` of `data` to `to` if it is writable (`WouldBlock` clears the readiness), as
/// tokio's `try_write` but through rustix: the system call itself, without the C library's
/// wrapper, which makes `send` a thread-cancellation point (two calls around each send).
fn send(to: &TcpStream, data: &[u8]) -> io::Result<usize> {
    to.try_io(Interest::WRITABLE, || Ok(rustix::net::send(to, data, rustix::net::SendFlags::NOSIGNAL)?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proxy::limits::{ConnLimitConfig, ConnLimits, Refusal};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets: (the proxy's end, the peer's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (proxy, _) = listener.accept().await.unwrap();
        (proxy, peer)
    }

    /// What a relay counted.
    #[derive(Default)]
    struct Counts {
        activity: AtomicU64,
        up: [AtomicU64; 2],
        down: [AtomicU64; 2],
        spliced: AtomicU64,
    }

    /// Relays between the proxy's ends of two pairs, with splicing under `limits` (one
    /// connection admitted) unless `None`.
    async fn run_relay(
        client: TcpStream,
        upstream: TcpStream,
        limits: Option<Arc<ConnLimits>>,
        counts: &Counts,
    ) -> io::Result<()> {
        let base = Instant::now();
        fn meter<'a>(activity: &'a AtomicU64, base: Instant, bytes: &'a [AtomicU64; 2]) -> Meter<'a> {
            Meter { activity, base, bytes: [&bytes[0], &bytes[1]] }
        }
        let mut guard = limits.map(|limits| limits.admit().unwrap());
        let splicing = guard.as_mut().map(|guard| Splicing::new(guard, &counts.spliced));
        let (up, down) =
            (meter(&counts.activity, base, &counts.up), meter(&counts.activity, base, &counts.down));
        relay(&client, &upstream, 64 * 1024, splicing.as_ref(), up, down).await
    }

    /// Many small exchanges in turn: each read drains its socket (short), clears the readiness
    /// without an `EAGAIN`, and the next message still wakes the relay (none is lost); an end of
    /// stream that arrives with the last bytes is still seen. Nothing is spliced.
    #[tokio::test]
    async fn small_exchanges_are_copied_and_none_is_lost() {
        let (near, mut client) = pair().await;
        let (far, mut backend) = pair().await;
        let limits = Arc::new(ConnLimits::new(ConnLimitConfig { max: 16, per_client: 0 }));
        let counts = Counts::default();
        let relay = run_relay(near, far, Some(limits.clone()), &counts);
        let peers = async {
            for i in 0..500u32 {
                let message = i.to_be_bytes();
                client.write_all(&message).await.unwrap();
                let mut got = [0u8; 4];
                backend.read_exact(&mut got).await.unwrap();
                assert_eq!(got, message);
                backend.write_all(&got).await.unwrap();
                client.read_exact(&mut got).await.unwrap();
                assert_eq!(got, message);
            }
            // The last bytes and the end of stream in one go, both ways.
            client.write_all(b"bye").await.unwrap();
            client.shutdown().await.unwrap();
            let mut rest = Vec::new();
            backend.read_to_end(&mut rest).await.unwrap();
            assert_eq!(rest, b"bye");
            backend.write_all(b"ok").await.unwrap();
            backend.shutdown().await.unwrap();
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).await.unwrap();
            assert_eq!(rest, b"ok");
        };
        let (relayed, ()) =
            tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(relay, peers) })
                .await
                .expect("the relay lost a wakeup");
        relayed.unwrap();
        assert_eq!(counts.up[0].load(Relaxed), 500 * 4 + 3);
        assert_eq!(counts.down[1].load(Relaxed), 500 * 4 + 2);
        assert_eq!(counts.spliced.load(Relaxed), 0, "a short exchange takes no pipe");
    }

    /// Relays `size` bytes client → backend, every one checked, then `done` back, with
    /// splicing under `limits` (none: splicing off); `while_open` runs once the backend has
    /// every byte, before it answers. What the relay counted.
    async fn upload(size: usize, limits: Option<Arc<ConnLimits>>, while_open: impl FnOnce()) -> Counts {
        let pattern = |i: usize| (i.wrapping_mul(7).wrapping_add(i >> 11) % 253) as u8;
        let (near, mut client) = pair().await;
        let (far, mut backend) = pair().await;
        let counts = Counts::default();
        let relay = run_relay(near, far, limits, &counts);
        let peers = async {
            let data: Vec<u8> = (0..size).map(pattern).collect();
            let send = async {
                client.write_all(&data).await.unwrap();
                client.shutdown().await.unwrap();
            };
            let receive = async {
                let mut got = Vec::with_capacity(size);
                backend.read_to_end(&mut got).await.unwrap();
                assert!(got == data, "the bytes differ ({} of {size} came)", got.len());
                while_open();
                backend.write_all(b"done").await.unwrap();
                backend.shutdown().await.unwrap();
            };
            tokio::join!(send, receive);
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            assert_eq!(answer, b"done");
        };
        let (relayed, ()) =
            tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(relay, peers) })
                .await
                .expect("the relay lost a wakeup");
        relayed.unwrap();
        assert_eq!(counts.up[0].load(Relaxed), size as u64);
        counts
    }

    /// A bulk transfer fills a read, and its direction turns to splice: every byte arrives in
    /// order, the connection is counted spliced once, and its pipe counts against the
    /// connection limit while the relay runs. The small answer back is copied.
    #[tokio::test]
    async fn a_bulk_direction_turns_to_splice_and_its_pipe_is_counted() {
        // Two pairs: the connection, and one pipe.
        let limits = Arc::new(ConnLimits::new(ConnLimitConfig { max: 2, per_client: 0 }));
        let counts = upload(8 << 20, Some(limits.clone()), || {
            // The pipe is still held: no room for another connection.
            assert_eq!(limits.admit().err(), Some(Refusal::Total), "the pipe is not counted");
        })
        .await;
        assert_eq!(counts.spliced.load(Relaxed), 1, "the bulk direction spliced");
        assert!(limits.admit().is_ok(), "the connection and its pipe are given back");
    }

    /// Without room for a pipe (or with splicing off) a bulk transfer keeps copying, intact:
    /// a read that fills the buffer leaves the readiness set, so the bytes behind it are read
    /// without waiting for a new edge (which may never come).
    #[tokio::test]
    async fn without_room_for_a_pipe_a_bulk_transfer_is_copied() {
        for limits in [Some(Arc::new(ConnLimits::new(ConnLimitConfig { max: 1, per_client: 0 }))), None] {
            let counts = upload(4 << 20, limits, || {}).await;
            assert_eq!(counts.spliced.load(Relaxed), 0);
        }
    }
}
