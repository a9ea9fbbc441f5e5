//! [`Heartbeat`]: a timer kept pending while a listener accepts connections, so that the
//! connections' own timers never wake the timer runtime's thread.
//!
//! When the timer runtime's thread parks ([`runtime`](super::runtime)), tokio's time driver
//! notes the earliest deadline it will wake for; a timer set later with an earlier deadline (or
//! set when no timer was pending at all) makes the L4 thread that sets it unpark that thread:
//! a futex call, and a wake-up of the timer thread that finds nothing due. With no other timer
//! pending between two connections, each L4 connection's first timer (its connect timeout)
//! did so. (On a runtime with its own time driver it was an `eventfd` write and one more
//! `epoll_wait` turn per connection, which nginx does not make.)
//!
//! The heartbeat is a timer due within [`PERIOD`] while connections keep coming. A connection's
//! timers (connect and idle timeouts of at least `PERIOD`) are later than it, so they never move
//! the wake-up earlier. It stops after a period in which nothing was accepted, so an idle
//! process is not woken; the first connection after a quiet period pays the one wake-up.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// How often the heartbeat fires while connections come.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    sleep: Pin<Box<Sleep>>,
    /// The timer is armed.
    beating: bool,
    /// A connection was accepted since the last beat.
    accepted: bool,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat { sleep: Box::pin(super::runtime::sleep(PERIOD)), beating: false, accepted: false }
    }
}

impl Heartbeat {
    /// A connection was accepted: keeps the heartbeat going, or starts it.
    pub(crate) fn accepted(&mut self) {
        self.accepted = true;
        if !self.beating {
            self.beating = true;
            self.sleep.as_mut().reset(Instant::now() + PERIOD);
        }
    }

    /// Resolves at each beat (re-armed if a connection came since the last one, else stopped);
    /// pending while stopped. Polled with the listener's accept.
    #[cfg(test)]
    pub(crate) async fn beat(&mut self) {
        std::future::poll_fn(|cx| self.poll_beat(cx)).await;
    }

    pub(crate) fn poll_beat(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.beating {
            return Poll::Pending;
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if std::mem::take(&mut self.accepted) {
            // Set right after the driver woke for the last beat: later than anything it noted.
            self.sleep.as_mut().reset(Instant::now() + PERIOD);
        } else {
            self.beating = false;
        }
        Poll::Ready(())
    }

    /// Whether the timer is armed.
    #[cfg(test)]
    fn beating(&self) -> bool {
        self.beating
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The heartbeat starts with a connection, beats while connections come, and stops after
    /// a period without one.
    #[tokio::test(start_paused = true)]
    async fn beats_while_connections_come_and_stops_after_a_quiet_period() {
        let mut heartbeat = Heartbeat::default();
        let started = Instant::now();
        let quiet = tokio::time::timeout(3 * PERIOD, heartbeat.beat()).await;
        assert!(quiet.is_err(), "no connection, no beat");
        assert!(!heartbeat.beating());
        heartbeat.accepted();
        let armed = Instant::now();
        heartbeat.beat().await;
        assert!(armed.elapsed() >= PERIOD, "a beat a period after the first connection");
        assert!(heartbeat.beating(), "a connection came in the period: it goes on");
        heartbeat.beat().await;
        assert!(!heartbeat.beating(), "a period without a connection: it stops");
        let quiet = tokio::time::timeout(3 * PERIOD, heartbeat.beat()).await;
        assert!(quiet.is_err(), "stopped: no more beats");
        heartbeat.accepted();
        heartbeat.accepted();
        heartbeat.beat().await;
        assert!(started.elapsed() >= 6 * PERIOD);
    }
}
