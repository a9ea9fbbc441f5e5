//! [`Stall`]: a timeout on waiting without progress, for I/O whose every operation may wait
//! (a client's writes, a request body's reads), that costs nothing while nothing waits.
//!
//! A plain `tokio::time::timeout` per operation would allocate and insert a timer for each write
//! or body frame. A [`Stall`] allocates its timer the first time an operation waits and re-arms
//! it only when a new wait starts after progress; an operation that completes at once is a
//! boolean store.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The wait of one kind of operation (see the module docs).
#[derive(Debug, Default)]
pub struct Stall {
    /// Fires `timeout` after the current wait began.
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
}

impl Stall {
    /// The operation made progress: the current wait, if any, is over.
    #[inline]
    pub fn progressed(&mut self) {
        self.waiting = false;
    }

    /// The operation must wait: `Ready` once it has waited `timeout` since it last progressed
    /// (the caller fails it), else `Pending` with the task woken when the time is up. A zero
    /// `timeout` never expires.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>, timeout: Duration) -> Poll<()> {
        if timeout.is_zero() {
            return Poll::Pending;
        }
        if !self.waiting {
            self.waiting = true;
            let deadline = Instant::now() + timeout;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        match &mut self.timer {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn poll(stall: &mut Stall, timeout: Duration) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(stall.poll_expired(cx, timeout))).await
    }

    #[tokio::test(start_paused = true)]
    async fn expires_after_a_wait_without_progress_and_progress_restarts_it() {
        let mut stall = Stall::default();
        let timeout = Duration::from_secs(5);
        assert!(poll(&mut stall, timeout).await.is_pending());
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(poll(&mut stall, timeout).await.is_pending(), "waiting again does not restart the clock");
        stall.progressed();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(poll(&mut stall, timeout).await.is_pending(), "progress restarted it");
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(poll(&mut stall, timeout).await.is_pending(), "4 s into the new wait");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(poll(&mut stall, timeout).await.is_ready(), "5 s into the new wait");
        assert!(poll(&mut Stall::default(), Duration::ZERO).await.is_pending(), "zero: no limit");
    }
}
