//! HTTP/2 streams stalled by flow control: a stream whose client grants it no window is reset
//! after the send timeout, and its upstream exchange released.
//!
//! hyper's HTTP/2 server runs each stream as a task spawned through the connection's executor.
//! It sends a response body by polling the body for a frame, then waiting for the stream's
//! flow-control window to take it. A client that grants no window (`SETTINGS_INITIAL_WINDOW_SIZE`
//! 0, or no `WINDOW_UPDATE`) leaves that stream waiting for ever while the socket itself takes
//! everything else, so the connection's send timeout (`SendTimeout`) never fires, and the
//! upstream connection stays held until the upstream's own timeouts.
//!
//! [`StreamExec`] spawns every stream task inside a [`Watched`] future. The response body
//! (`Metered`, the one response body type) reports each of its polls through a thread-local
//! mark that [`Watched`] reads around each poll of its stream: a body that returned `Pending`
//! waits for its upstream (not our business: `proxy-read-timeout`); a body that returned a frame
//! and has not been polled since waits for the client's window. A stream that waits for window
//! for the send timeout is dropped. h2 then resets it with `RST_STREAM(CANCEL)`, the code RFC
//! 9113 §7 gives a stream "no longer needed", which is what the server decided; not
//! `INTERNAL_ERROR` (nothing failed inside weir), nor `FLOW_CONTROL_ERROR` or `PROTOCOL_ERROR`
//! (a zero window breaks no rule). Dropping the stream drops its response body, and with it the
//! upstream connection; the connection's other streams are untouched.
//!
//! Progress is a new frame taken from the body: the body's frames are at most one upstream
//! read, so a client that takes a frame's bytes slower than one frame per send timeout is cut
//! too, as nginx's `send_timeout` cuts a client that takes nothing from one write for as long.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use crate::stall::Stall;

/// What a stream's response did during one poll of its task (the last event wins).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Seen {
    /// Nothing: the stream's state is what it was.
    #[default]
    Nothing,
    /// The response head was made: the stream sends it, then its body.
    Responded,
    /// The body gave a frame: the stream sends it once the window allows.
    Frame,
    /// The body waits for its upstream.
    Waiting,
    /// The body ended or failed: nothing more waits for window.
    Ended,
}

thread_local! {
    /// What the stream being polled on this thread did; [`Watched`] sets and reads it.
    static SEEN: Cell<Seen> = const { Cell::new(Seen::Nothing) };
}

/// Called by the response body after each poll of its inner body.
#[inline]
pub(super) fn body_polled<T>(polled: &Poll<Option<T>>) {
    let seen = match polled {
        Poll::Pending => Seen::Waiting,
        Poll::Ready(Some(_)) => Seen::Frame,
        Poll::Ready(None) => Seen::Ended,
    };
    SEEN.set(seen);
}

/// Called when a response head is made (before its body is polled).
#[inline]
pub(super) fn responded() {
    SEEN.set(Seen::Responded);
}

/// The executor of HTTP/2 server connections: spawns each stream on tokio, watched for
/// flow-control stalls longer than `send_timeout` (zero: not watched).
#[derive(Clone, Copy, Debug)]
pub(super) struct StreamExec {
    send_timeout: Duration,
}

impl StreamExec {
    pub(super) fn new(send_timeout: Duration) -> Self {
        StreamExec { send_timeout }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        if self.send_timeout.is_zero() {
            tokio::spawn(fut);
        } else {
            tokio::spawn(Watched::new(fut, self.send_timeout));
        }
    }
}

pin_project! {
    /// A stream task dropped once it has waited for flow-control window for `timeout`.
    pub(super) struct Watched<F> {
        #[pin]
        stream: Option<F>,
        timeout: Duration,
        stall: Stall,
        // The response waits for the client's window (not for its upstream).
        awaiting_window: bool,
    }
}

impl<F> Watched<F> {
    fn new(stream: F, timeout: Duration) -> Self {
        Watched { stream: Some(stream), timeout, stall: Stall::default(), awaiting_window: false }
    }
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let Some(stream) = this.stream.as_mut().as_pin_mut() else {
            return Poll::Ready(());
        };
        let outer = SEEN.replace(Seen::Nothing);
        let polled = stream.poll(cx);
        let seen = SEEN.replace(outer);
        if polled.is_ready() {
            return Poll::Ready(());
        }
        match seen {
            Seen::Nothing => {}
            Seen::Responded | Seen::Frame => {
                this.stall.progressed();
                *this.awaiting_window = true;
            }
            Seen::Waiting | Seen::Ended => {
                this.stall.progressed();
                *this.awaiting_window = false;
            }
        }
        if *this.awaiting_window && this.stall.poll_expired(cx, *this.timeout).is_ready() {
            // Dropping the stream's handles makes h2 send RST_STREAM(CANCEL).
            this.stream.set(None);
            tracing::debug!(
                timeout = ?this.timeout,
                "HTTP/2 stream reset (CANCEL): the client granted no flow-control window within the send timeout"
            );
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A stream task that never finishes and, at its next poll, reports what the test set (once);
    /// `dropped` is set when it is dropped.
    struct Fake {
        next: Arc<Mutex<Seen>>,
        dropped: Arc<AtomicBool>,
    }

    impl Future for Fake {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
            let seen = std::mem::take(&mut *self.next.lock().unwrap());
            if seen != Seen::Nothing {
                SEEN.set(seen);
            }
            Poll::Pending
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    fn fake() -> (Fake, Arc<Mutex<Seen>>, Arc<AtomicBool>) {
        let next = Arc::new(Mutex::new(Seen::Nothing));
        let dropped = Arc::new(AtomicBool::new(false));
        (Fake { next: next.clone(), dropped: dropped.clone() }, next, dropped)
    }

    /// Polls `watched` once, after its stream reports `seen`.
    async fn poll(watched: Pin<&mut Watched<Fake>>, next: &Mutex<Seen>, seen: Seen) -> Poll<()> {
        *next.lock().unwrap() = seen;
        let mut watched = Some(watched);
        std::future::poll_fn(|cx| Poll::Ready(watched.take().map_or(Poll::Pending, |w| w.poll(cx)))).await
    }

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn a_frame_waiting_for_window_past_the_timeout_drops_the_stream() {
        let (stream, next, dropped) = fake();
        let mut watched = std::pin::pin!(Watched::new(stream, TIMEOUT));
        assert!(poll(watched.as_mut(), &next, Seen::Frame).await.is_pending());
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(poll(watched.as_mut(), &next, Seen::Nothing).await.is_pending(), "4 s: not yet");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(poll(watched.as_mut(), &next, Seen::Nothing).await.is_ready(), "6 s: reset");
        assert!(dropped.load(Ordering::SeqCst), "the stream was dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_waiting_for_its_upstream_is_never_cut() {
        let (stream, next, dropped) = fake();
        let mut watched = std::pin::pin!(Watched::new(stream, TIMEOUT));
        assert!(poll(watched.as_mut(), &next, Seen::Responded).await.is_pending());
        assert!(poll(watched.as_mut(), &next, Seen::Waiting).await.is_pending());
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(10)).await;
            assert!(poll(watched.as_mut(), &next, Seen::Nothing).await.is_pending());
        }
        assert!(!dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_counts_from_the_last_frame() {
        let (stream, next, dropped) = fake();
        let mut watched = std::pin::pin!(Watched::new(stream, TIMEOUT));
        assert!(poll(watched.as_mut(), &next, Seen::Responded).await.is_pending());
        tokio::time::advance(Duration::from_secs(4)).await;
        // Window came: the body gave its next frame, which waits again.
        assert!(poll(watched.as_mut(), &next, Seen::Frame).await.is_pending());
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(poll(watched.as_mut(), &next, Seen::Nothing).await.is_pending(), "4 s after the frame");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(poll(watched.as_mut(), &next, Seen::Nothing).await.is_ready(), "6 s after the frame");
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(SEEN.get(), Seen::Nothing, "the mark of the outer scope is restored");
    }
}
