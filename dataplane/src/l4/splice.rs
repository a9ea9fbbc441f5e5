//! Zero-copy relay of one direction of a TCP service connection with splice(2), once its
//! reads fill the copy buffer (`pump`): bytes move from the source socket into a pipe and from
//! the pipe into the destination socket, so the kernel hands socket pages over instead of
//! copying them through a userspace buffer (as HAProxy's `splice-auto`).
//!
//! - Driven by tokio's readiness (`TcpStream::poll_read_ready`/`poll_write_ready`, `try_io`;
//!   each socket's read readiness is waited on by one direction and its write readiness by the
//!   other, in one task, so the stream's single reader and writer waker slots suffice and no
//!   waiter is queued and unqueued per wait as `readable()`/`writable()` do): the direction waits
//!   for its source to be readable, fills its empty pipe with one splice, then drains the pipe
//!   into its destination as it becomes writable. Only an empty pipe is filled, so an `EAGAIN`
//!   from the source always means "nothing to read" (never "pipe full") and clearing the read
//!   readiness on it is right. (A short splice proves nothing, unlike a short `recv`: a pipe
//!   also fills by its slots, one per socket buffer, before its bytes.)
//! - End of stream from the source is passed on as a half-close (`shutdown(SHUT_WR)`) of the
//!   destination, as the copy does.
//! - Pipes come from a small per-thread pool and go back to it when their direction ends with
//!   them empty; a pipe still holding bytes (a side failed mid-transfer) is closed. The pipes
//!   alive at once are capped by a share of the open-file limit, so splice never takes the
//!   descriptors that connections need; past the cap, or when the kernel refuses a pipe, the
//!   direction keeps copying ([`Lent::take`] fails). A pipe also counts against the connection
//!   limit while its connection holds it (`ConnGuard::hold_pipe`, checked by the caller first);
//!   pooled pipes belong to no connection and are bounded by the pool size per thread and this
//!   cap.
//!
//! SIGPIPE: a splice into a socket whose peer is gone may raise it; the Rust runtime ignores
//! SIGPIPE from before `main`, so the call fails with `EPIPE` as a write does.

use std::cell::RefCell;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::stats::Meter;

/// Pipes kept for reuse per runtime thread.
const POOL_PER_THREAD: usize = 16;

/// The share of the open-file limit pipes may hold: one pipe in `FD_SHARE` descriptors (two
/// descriptors per pipe, a pipe per spliced direction).
const FD_SHARE: u64 = 8;

/// Pipes alive (in use or pooled) in the process.
static ALIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static POOL: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

/// One pipe: the two descriptors and the bytes it holds now.
#[derive(Debug)]
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Its capacity in bytes (what one splice in may move).
    size: usize,
    /// Bytes spliced in and not yet out.
    held: usize,
}

impl Drop for Pipe {
    fn drop(&mut self) {
        ALIVE.fetch_sub(1, Relaxed);
    }
}

/// A pipe lent to one direction of a connection, given back to this thread's pool when dropped
/// empty.
#[derive(Debug)]
pub(crate) struct Lent(Option<Pipe>);

impl Lent {
    /// A pipe of `size` bytes (a capacity the kernel may round up; `F_SETPIPE_SZ` only when it
    /// differs from the default), from this thread's pool or new. Fails when the pipe cap is
    /// reached or the kernel refuses (no descriptors, no pipe memory): copy instead.
    pub(crate) fn take(size: usize) -> io::Result<Lent> {
        let pooled =
            POOL.with(|pool| pool.try_borrow_mut().ok().and_then(|mut pool| pooled(&mut pool, size)));
        match pooled {
            Some(pipe) => Ok(Lent(Some(pipe))),
            None => new_pipe(size).map(|pipe| Lent(Some(pipe))),
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(pipe) = self.0.take() else { return };
        POOL.with(|pool| {
            let Ok(mut pool) = pool.try_borrow_mut() else { return };
            // A pipe holding bytes of a failed transfer is closed (dropped): that discards them.
            if pipe.held == 0 && pool.len() < POOL_PER_THREAD {
                pool.push(pipe);
            }
        });
    }
}

/// The most pipes alive at once: a share of the soft open-file limit (read once; weir raises
/// it at start, before any connection).
fn cap() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        let nofile = limit.current.unwrap_or(1 << 20);
        usize::try_from(nofile / FD_SHARE).unwrap_or(usize::MAX)
    })
}

/// A pooled pipe of at least `size` bytes (the last one pooled, when it is large enough).
fn pooled(pool: &mut Vec<Pipe>, size: usize) -> Option<Pipe> {
    let at = pool.iter().rposition(|p| p.size >= size)?;
    Some(pool.swap_remove(at))
}

/// A new pipe of `size` bytes, within the cap.
fn new_pipe(size: usize) -> io::Result<Pipe> {
    if ALIVE.fetch_add(1, Relaxed) >= cap() {
        ALIVE.fetch_sub(1, Relaxed);
        return Err(io::Error::other("pipe cap reached (a share of the open-file limit)"));
    }
    let (read, write) = match rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK) {
        Ok(pair) => pair,
        Err(error) => {
            ALIVE.fetch_sub(1, Relaxed);
            return Err(error.into());
        }
    };
    // From here `Pipe`'s drop counts it out.
    let mut pipe = Pipe { read, write, size: 0, held: 0 };
    let default = rustix::pipe::fcntl_getpipe_size(&pipe.write)?;
    pipe.size = if size > default {
        // Past `/proc/sys/fs/pipe-max-size` (or the per-user pipe memory) the kernel refuses:
        // keep the default capacity.
        rustix::pipe::fcntl_setpipe_size(&pipe.write, size).unwrap_or(default)
    } else {
        default
    };
    Ok(pipe)
}

/// Moves `from` into `to` through `pipe` until `from` ends, then shuts `to`'s write side.
pub(crate) async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    mut lent: Lent,
    meter: &Meter<'_>,
) -> io::Result<()> {
    let Some(pipe) = lent.0.as_mut() else {
        return Err(io::Error::other("splice pipe already given back"));
    };
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    loop {
        // The pipe is empty here: an EAGAIN means the socket has nothing to read.
        let n = loop {
            std::future::poll_fn(|cx| from.poll_read_ready(cx)).await?;
            let spliced = from.try_io(Interest::READABLE, || {
                Ok(rustix::pipe::splice(from, None, &pipe.write, None, pipe.size, flags)?)
            });
            match spliced {
                Ok(n) => break n,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        };
        if n == 0 {
            return rustix::net::shutdown(to, rustix::net::Shutdown::Write).map_err(io::Error::from);
        }
        pipe.held = n;
        while pipe.held > 0 {
            std::future::poll_fn(|cx| to.poll_write_ready(cx)).await?;
            let spliced = to.try_io(Interest::WRITABLE, || {
                Ok(rustix::pipe::splice(&pipe.read, None, to, None, pipe.held, flags)?)
            });
            match spliced {
                Ok(m) => pipe.held -= m.min(pipe.held),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
        meter.moved(n);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Pipes given back empty are reused by the next connection on the thread; a pipe left
    /// holding bytes is closed, not pooled.
    #[test]
    fn empty_pipes_are_reused_and_full_ones_closed() {
        let fd = |lent: &Lent| lent.0.as_ref().map(|p| std::os::fd::AsRawFd::as_raw_fd(&p.read));
        POOL.with(|p| p.borrow_mut().clear());
        let (up, down) = (Lent::take(64 * 1024).unwrap(), Lent::take(64 * 1024).unwrap());
        let first = fd(&up);
        assert!(up.0.as_ref().unwrap().size >= 64 * 1024);
        drop((up, down));
        assert_eq!(POOL.with(|p| p.borrow().len()), 2);
        let (mut up, down) = (Lent::take(64 * 1024).unwrap(), Lent::take(64 * 1024).unwrap());
        assert!([fd(&up), fd(&down)].contains(&first), "a pooled pipe is taken again");
        assert_eq!(POOL.with(|p| p.borrow().len()), 0);
        if let Some(p) = up.0.as_mut() {
            p.held = 1;
        }
        drop((up, down));
        assert_eq!(POOL.with(|p| p.borrow().len()), 1, "only the empty pipe went back");
    }

    /// A capacity above the default is asked of the kernel (it grants up to `pipe-max-size`).
    #[test]
    fn a_larger_pipe_is_asked_for() {
        POOL.with(|p| p.borrow_mut().clear());
        let lent = Lent::take(256 * 1024).unwrap();
        let pipe = lent.0.as_ref().unwrap();
        assert_eq!(pipe.size, rustix::pipe::fcntl_getpipe_size(&pipe.write).unwrap());
        let size = pipe.size;
        let max: usize =
            std::fs::read_to_string("/proc/sys/fs/pipe-max-size").unwrap().trim().parse().unwrap();
        if max >= 256 * 1024 {
            assert_eq!(size, 256 * 1024);
        }
    }
}
