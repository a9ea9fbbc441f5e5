//! Deadlines of an HTTP/1 connection that cost no timer-wheel work per request.
//!
//! Every HTTP/1.1 request waits under two deadlines: the client's request head must arrive in
//! time (hyper's `header_read_timeout`, also the keep-alive idle timeout) and the upstream's
//! response head must (`proxy-read-timeout`). With a fresh tokio timer per wait, each request
//! paid for two timer allocations, two insertions into and removals from tokio's timer wheel
//! (under its lock) and their bookkeeping: ~5 % of the proxy's instructions on HTTP/1.1
//! keep-alive (bench/RESULTS.md). Almost none of those timers ever fires.
//!
//! A [`Deadline`] keeps one tokio timer for the connection's life and arms it lazily: a new wait
//! only records its instant; the timer is re-armed when it fires before the current wait's
//! deadline (the usual case: each request pushes the deadline later) or when a wait's deadline
//! is earlier than the armed one. So a request costs a clock read and a comparison, and the
//! timer wheel sees about one operation per timeout period per connection instead of two per
//! request. Waiting again from the same task with the timer armed is a comparison too.
//!
//! One waiter at a time: the timer keeps one waker. That holds on an HTTP/1 connection, whose
//! requests (and the waits of each) follow one another in its one task. HTTP/2 streams run
//! concurrently in tasks of their own: each borrows a [`Deadline`] from its connection's
//! [`Deadlines`] for its wait and gives it back, so a connection keeps about as many timers as
//! it has streams in flight, each re-armed only when it fires (a fresh tokio timer per stream
//! cost ~1,200 instructions of the ~46,000 of an HTTP/2 request: allocation, wheel insertion and
//! removal, the runtime handle's lookup).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hyper::rt::Timer;
use tokio::time::{Instant, Sleep};

/// A connection's lazily re-armed timer (see the module docs).
#[derive(Default)]
pub(super) struct Deadline(Mutex<Armed>);

#[derive(Default)]
struct Armed {
    /// tokio's timer, once a wait has needed it.
    sleep: Option<Pin<Box<Sleep>>>,
    /// When `sleep` fires (it is re-armed only as waits need).
    at: Option<Instant>,
    /// The waker `sleep` holds, to skip re-registering the same task.
    waker: Option<Waker>,
}

impl Deadline {
    /// Whether `deadline` has passed; otherwise the task is woken when it has (or a little
    /// earlier, to be asked again).
    pub(super) fn poll_until(&self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let armed = &mut *guard;
        let sleep = match &mut armed.sleep {
            Some(sleep) => sleep,
            None => {
                armed.at = Some(deadline);
                armed.sleep.insert(Box::pin(tokio::time::sleep_until(deadline)))
            }
        };
        loop {
            match armed.at {
                // Armed later than this wait needs: bring it forward.
                Some(at) if at > deadline => {
                    sleep.as_mut().reset(deadline);
                    armed.at = Some(deadline);
                    armed.waker = None;
                }
                // Fired (at or before this deadline): done, or re-armed for the rest.
                Some(_) if sleep.is_elapsed() => {
                    if Instant::now() >= deadline {
                        return Poll::Ready(());
                    }
                    sleep.as_mut().reset(deadline);
                    armed.at = Some(deadline);
                    armed.waker = None;
                }
                _ => {}
            }
            // Armed no later than the deadline, not fired, holding this task's waker.
            if armed.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                return Poll::Pending;
            }
            match sleep.as_mut().poll(cx) {
                Poll::Pending => {
                    armed.waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                // Fired: the next turn of the loop decides.
                Poll::Ready(()) => armed.waker = None,
            }
        }
    }

    /// `future`, unless `timeout` passes first (then `Err(Elapsed)`).
    pub(super) fn timeout<F: Future>(&self, timeout: Duration, future: F) -> Timeout<'_, F> {
        Timeout { future, deadline: Instant::now() + timeout, timer: self }
    }
}

/// The [`Deadline`]s of one HTTP/2 connection's streams, lent one per wait (see the module docs).
// Boxed: a lent deadline is a pointer in the request's future, not the timer's whole state.
#[allow(clippy::vec_box)]
#[derive(Default)]
pub(super) struct Deadlines(Mutex<Vec<Box<Deadline>>>);

/// At most this many deadlines wait for the next stream; more in flight are dropped when given
/// back (a connection with more streams in flight than this creates timers for the rest).
const KEPT: usize = 32;

impl Deadlines {
    /// A deadline for one stream's wait, given back when the returned guard drops.
    pub(super) fn lend(&self) -> Lent<'_> {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
        Lent { deadline: Some(kept.unwrap_or_default()), home: self }
    }
}

/// A [`Deadline`] lent by [`Deadlines::lend`].
pub(super) struct Lent<'a> {
    deadline: Option<Box<Deadline>>,
    home: &'a Deadlines,
}

impl std::ops::Deref for Lent<'_> {
    type Target = Deadline;

    fn deref(&self) -> &Deadline {
        // `Some` from `lend` until `drop` takes it.
        self.deadline.as_deref().unwrap_or_else(|| unreachable!("a lent deadline is there until dropped"))
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(deadline) = self.deadline.take() {
            let mut kept = self.home.0.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() < KEPT {
                kept.push(deadline);
            }
        }
    }
}

/// The wait ran out of time.
#[derive(Debug)]
pub(super) struct Elapsed;

pin_project_lite::pin_project! {
    /// [`Deadline::timeout`]'s future.
    pub(super) struct Timeout<'a, F> {
        #[pin]
        future: F,
        deadline: Instant,
        timer: &'a Deadline,
    }
}

impl<F: Future> Future for Timeout<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.future.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        this.timer.poll_until(*this.deadline, cx).map(|()| Err(Elapsed))
    }
}

/// hyper's timer for one HTTP/1 connection's request-head deadlines, on a [`Deadline`].
#[derive(Clone, Default)]
pub(super) struct ConnTimer(Arc<Deadline>);

impl Timer for ConnTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HeadSleep { deadline: Instant::from_std(deadline), timer: self.0.clone() })
    }

    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }
}

/// One wait of [`ConnTimer`].
struct HeadSleep {
    deadline: Instant,
    timer: Arc<Deadline>,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.timer.poll_until(self.deadline, cx)
    }
}

impl hyper::rt::Sleep for HeadSleep {}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[tokio::test(start_paused = true)]
    async fn waits_fire_at_their_deadline_and_later_waits_reuse_the_timer() {
        let timer = Deadline::default();
        let (woken, w) = waker();
        let mut cx = Context::from_waker(&w);
        let start = Instant::now();
        // A first wait of 10 s, then a later one (as the next request would) of 10 s from 4 s on.
        assert!(timer.poll_until(start + Duration::from_secs(10), &mut cx).is_pending());
        tokio::time::advance(Duration::from_secs(4)).await;
        let second = start + Duration::from_secs(14);
        assert!(timer.poll_until(second, &mut cx).is_pending());
        // At 10 s the timer fires for the first deadline; the second is not due: re-armed.
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "woken when the armed instant passed");
        assert!(timer.poll_until(second, &mut cx).is_pending());
        tokio::time::advance(Duration::from_millis(3_999)).await;
        assert!(timer.poll_until(second, &mut cx).is_pending());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(woken.0.load(Ordering::SeqCst), 2, "woken at the second deadline");
        assert!(timer.poll_until(second, &mut cx).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_brings_the_timer_forward() {
        let timer = Deadline::default();
        let (woken, w) = waker();
        let mut cx = Context::from_waker(&w);
        let start = Instant::now();
        assert!(timer.poll_until(start + Duration::from_secs(60), &mut cx).is_pending());
        let short = start + Duration::from_secs(1);
        assert!(timer.poll_until(short, &mut cx).is_pending());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(timer.poll_until(short, &mut cx).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn another_task_waiting_gets_the_wakeup() {
        let timer = Deadline::default();
        let (first, w1) = waker();
        let (second, w2) = waker();
        let at = Instant::now() + Duration::from_secs(5);
        assert!(timer.poll_until(at, &mut Context::from_waker(&w1)).is_pending());
        assert!(timer.poll_until(at, &mut Context::from_waker(&w2)).is_pending());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn lent_deadlines_serve_concurrent_waits_and_come_back() {
        let deadlines = Deadlines::default();
        let (first, w1) = waker();
        let (second, w2) = waker();
        let start = Instant::now();
        {
            // Two streams at once: each has its own timer, each woken at its own deadline.
            let a = deadlines.lend();
            let b = deadlines.lend();
            assert!(a.poll_until(start + Duration::from_secs(2), &mut Context::from_waker(&w1)).is_pending());
            assert!(b.poll_until(start + Duration::from_secs(5), &mut Context::from_waker(&w2)).is_pending());
            tokio::time::advance(Duration::from_secs(2)).await;
            assert_eq!((first.0.load(Ordering::SeqCst), second.0.load(Ordering::SeqCst)), (1, 0));
            assert!(a.poll_until(start + Duration::from_secs(2), &mut Context::from_waker(&w1)).is_ready());
            tokio::time::advance(Duration::from_secs(3)).await;
            assert_eq!((first.0.load(Ordering::SeqCst), second.0.load(Ordering::SeqCst)), (1, 1));
        }
        assert_eq!(deadlines.0.lock().unwrap().len(), 2, "both given back");
        // A later stream reuses one: its wait is its own, from a new task.
        let (third, w3) = waker();
        let c = deadlines.lend();
        assert_eq!(deadlines.0.lock().unwrap().len(), 1);
        let at = Instant::now() + Duration::from_secs(10);
        assert!(c.poll_until(at, &mut Context::from_waker(&w3)).is_pending());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(third.0.load(Ordering::SeqCst), 1, "the new task is woken");
        assert!(c.poll_until(at, &mut Context::from_waker(&w3)).is_ready());
        drop(c);
        // No more than KEPT wait in the pool.
        let many: Vec<_> = (0..KEPT + 5).map(|_| deadlines.lend()).collect();
        drop(many);
        assert_eq!(deadlines.0.lock().unwrap().len(), KEPT);
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_returns_the_output_or_elapsed() {
        let timer = Deadline::default();
        assert_eq!(timer.timeout(Duration::from_secs(1), async { 7 }).await.ok(), Some(7));
        let slow = timer.timeout(Duration::from_secs(1), tokio::time::sleep(Duration::from_secs(2)));
        assert!(slow.await.is_err());
        // The same timer serves the next wait, which completes in time.
        let quick = timer.timeout(Duration::from_secs(3), tokio::time::sleep(Duration::from_secs(2)));
        assert!(quick.await.is_ok());
    }
}
