//! The runtime the L4 services run on: tokio with an I/O driver and no time driver, on threads
//! of its own, with its connections' timers kept by a second runtime that has a time driver
//! only.
//!
//! A tokio runtime with a time driver consults its timer wheel around every park: the next
//! deadline, two clock reads, the expired entries, each under the driver's lock. A one-byte L4
//! connection parks the runtime about four times, and that was ~2,350 of its ~16,300
//! user-space instructions (`bench/callgrind/l4.sh`). Without a time driver the I/O runtime
//! parks straight in `epoll_wait`.
//!
//! The connections' timers (the PROXY header, connect and idle timeouts, the accept loop's
//! back-off and [`Heartbeat`](super::heartbeat::Heartbeat)) are tokio [`Sleep`]s made in the
//! timer runtime's context by [`sleep`]. An L4 thread sets, moves and drops them as it did on
//! its own driver (a moved deadline that is later costs no lock, as before). The timer
//! runtime's one thread wakes only when a timer is due: a timeout that fires, or the heartbeat
//! once a second while connections come. A timer due earlier than the timer thread's next
//! wake-up wakes it (a futex call), which the heartbeat keeps connections' timers from doing.
//!
//! One thread runs the I/O runtime when the proxy has one thread for L4 (`--threads 1`, as
//! nginx's one worker); more make it a multi-threaded runtime. Stopping (the owner dropped)
//! drops the I/O runtime, its connections and their timers first, then the timer runtime: a
//! timer is never polled after its driver has shut down (tokio panics then).

use std::cell::OnceCell;
use std::io;
use std::time::Duration;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;
use tokio::time::Sleep;

thread_local! {
    /// The timer runtime of the L4 runtime this thread belongs to (unset elsewhere).
    static TIMERS: OnceCell<Handle> = const { OnceCell::new() };
}

/// A timer due after `duration`: on the timer runtime when called on an L4 thread, on the
/// current runtime's time driver otherwise (unit tests that run L4 parts on a runtime of
/// their own).
pub(crate) fn sleep(duration: Duration) -> Sleep {
    TIMERS.with(|timers| match timers.get() {
        Some(handle) => {
            let _entered = handle.enter();
            tokio::time::sleep(duration)
        }
        None => tokio::time::sleep(duration),
    })
}

/// Makes [`sleep`] on this thread use `timers`.
fn keep_timers_on(timers: Handle) {
    TIMERS.with(|cell| {
        let _ = cell.set(timers);
    });
}

/// The L4 runtimes; dropping it stops them (see the module docs).
#[derive(Debug)]
pub(crate) struct Runtime {
    io: Handle,
    _stop: oneshot::Sender<()>,
}

impl Runtime {
    /// Starts the runtimes: `threads` (at least one) threads for I/O, one for the timers. Waits
    /// (briefly, once) for the owner thread to have built them.
    pub(crate) fn start(threads: usize) -> io::Result<Runtime> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        std::thread::Builder::new().name("weir-l4".into()).spawn(move || {
            let (io, timers) = match build(threads) {
                Ok(runtimes) => runtimes,
                Err(error) => {
                    let _ = ready_tx.send(Err(error));
                    return;
                }
            };
            // With one thread, this one runs the connections.
            keep_timers_on(timers.handle().clone());
            let _ = ready_tx.send(Ok(io.handle().clone()));
            io.block_on(async {
                let _ = stop_rx.await;
            });
            // The connections and their timers first, then the timers' driver.
            drop(io);
            drop(timers);
        })?;
        let io = ready_rx.recv().map_err(|_| io::Error::other("the L4 runtime's thread stopped"))??;
        Ok(Runtime { io, _stop: stop_tx })
    }

    /// The I/O runtime, where listeners are bound and their tasks spawned.
    pub(crate) fn handle(&self) -> &Handle {
        &self.io
    }
}

/// The I/O runtime (current-thread for one thread, run by the owner thread) and the timer
/// runtime (one worker of its own).
fn build(threads: usize) -> io::Result<(tokio::runtime::Runtime, tokio::runtime::Runtime)> {
    let timers =
        Builder::new_multi_thread().worker_threads(1).thread_name("weir-l4-timers").enable_time().build()?;
    let io = if threads <= 1 {
        Builder::new_current_thread().enable_io().build()?
    } else {
        let handle = timers.handle().clone();
        Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("weir-l4")
            .enable_io()
            .on_thread_start(move || keep_timers_on(handle.clone()))
            .build()?
    };
    Ok((io, timers))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// On either runtime shape, a task on the L4 runtime has no time driver of its own
    /// (tokio's `sleep` panics there) yet its timers fire, on time, through `sleep`; and
    /// dropping the runtime stops its tasks (a pending one is dropped, not leaked).
    #[test]
    fn timers_fire_on_an_io_only_runtime_and_a_stop_drops_its_tasks() {
        for threads in [1, 3] {
            let runtime = Runtime::start(threads).unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            runtime.handle().spawn(async move {
                let own = std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::from_millis(1))));
                let started = Instant::now();
                sleep(Duration::from_millis(50)).await;
                let _ = tx.send((own.is_err(), started.elapsed()));
            });
            let (own_panicked, waited) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert!(own_panicked, "{threads} thread(s): the L4 runtime has no time driver");
            assert!(waited >= Duration::from_millis(50), "{threads} thread(s): fired early: {waited:?}");
            struct Dropped(std::sync::mpsc::Sender<()>);
            impl Drop for Dropped {
                fn drop(&mut self) {
                    let _ = self.0.send(());
                }
            }
            let (dropped_tx, dropped_rx) = std::sync::mpsc::channel();
            let dropped = Dropped(dropped_tx);
            runtime.handle().spawn(async move {
                let _dropped = dropped;
                sleep(Duration::from_secs(3600)).await;
            });
            drop(runtime);
            dropped_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
    }
}
