//! Response bodies with per-request limits attached: bandwidth (ingress-nginx `limit-rate` and
//! `limit-rate-after`, nginx's `limit_rate` / `limit_rate_after`) and the place the request
//! holds under `limit-connections` ([`crate::state::connlimit::Slot`]), freed when the body ends or is
//! dropped.
//!
//! The bandwidth limit paces data frames with a timer: once `after_bytes` have gone out, the
//! body yields its bytes no faster than `bytes_per_sec`, counted from its first frame. Large
//! frames are cut into pieces so that the pace is smooth; nothing spins while waiting.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::model::ResponseRate;
use crate::state::connlimit::Slot;

/// The largest piece a paced body yields at once.
const MAX_PIECE: u64 = 16 * 1024;
/// The smallest (so that slow rates still make progress in whole pieces).
const MIN_PIECE: u64 = 512;

/// A response body, with optional pacing and connection slot.
pub struct Shaped<B> {
    inner: B,
    extras: Option<Box<Extras>>,
}

/// What most responses do without: kept boxed so that the common body stays small.
struct Extras {
    slot: Option<Slot>,
    pace: Option<Pace>,
}

/// The state of one paced body.
struct Pace {
    rate: u64,
    after: u64,
    piece: usize,
    sent: u64,
    start: Option<Instant>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// Data taken from the inner body and not yet yielded.
    pending: Bytes,
}

impl Pace {
    fn new(rate: &ResponseRate) -> Option<Pace> {
        if rate.bytes_per_sec == 0 {
            return None;
        }
        // About a tenth of a second's worth at a time.
        let piece = (rate.bytes_per_sec / 10).clamp(MIN_PIECE, MAX_PIECE);
        Some(Pace {
            rate: rate.bytes_per_sec,
            after: rate.after_bytes,
            piece: usize::try_from(piece).unwrap_or(usize::MAX),
            sent: 0,
            start: None,
            sleep: None,
            pending: Bytes::new(),
        })
    }

    /// When the next byte may go: the bytes past the allowance sent so far, at the rate.
    fn due(&self, start: Instant) -> Instant {
        let over = self.sent.saturating_sub(self.after);
        start + Duration::from_secs_f64(over as f64 / self.rate as f64)
    }
}

impl<B> Shaped<B> {
    /// `inner` as it is.
    pub fn plain(inner: B) -> Self {
        Shaped { inner, extras: None }
    }

    /// The body inside.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Attaches the request's `slot` (freed with the body) and its bandwidth limit.
    pub fn limit(&mut self, slot: Option<Slot>, rate: Option<&ResponseRate>) {
        let pace = rate.and_then(Pace::new);
        if slot.is_none() && pace.is_none() {
            return;
        }
        self.extras = Some(Box::new(Extras { slot, pace }));
    }
}

impl<B> Body for Shaped<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let Some(extras) = this.extras.as_deref_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        let Some(pace) = extras.pace.as_mut() else {
            let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
            if frame.is_none() || this.inner.is_end_stream() {
                // The response has gone out: the client's place is free.
                extras.slot = None;
            }
            return Poll::Ready(frame);
        };
        loop {
            if let Some(sleep) = pace.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                pace.sleep = None;
            }
            if pace.pending.is_empty() {
                match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) if data.is_empty() => continue,
                        Ok(data) => pace.pending = data,
                        // Trailers: the body is over.
                        Err(frame) => {
                            extras.slot = None;
                            return Poll::Ready(Some(Ok(frame)));
                        }
                    },
                    end => {
                        extras.slot = None;
                        return Poll::Ready(end);
                    }
                }
            }
            let now = Instant::now();
            let start = *pace.start.get_or_insert(now);
            let due = pace.due(start);
            if due > now {
                pace.sleep = Some(Box::pin(tokio::time::sleep_until(due)));
                continue;
            }
            // Within the allowance a frame goes whole; past it, a piece at a time.
            let free = pace.after.saturating_sub(pace.sent);
            let len = pace.pending.len();
            let take = if (len as u64) <= free { len } else { len.min(pace.piece.max(free as usize)) };
            let piece = pace.pending.split_to(take);
            pace.sent += take as u64;
            if pace.pending.is_empty() && this.inner.is_end_stream() {
                extras.slot = None;
            }
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
    }

    fn is_end_stream(&self) -> bool {
        let pending =
            self.extras.as_ref().and_then(|e| e.pace.as_ref()).is_some_and(|p| !p.pending.is_empty());
        !pending && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let pending =
            self.extras.as_ref().and_then(|e| e.pace.as_ref()).map_or(0, |p| p.pending.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + pending);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + pending);
        }
        hint
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http_body_util::{BodyExt, Full, StreamBody};

    use super::*;

    fn rate(bytes_per_sec: u64, after_bytes: u64) -> ResponseRate {
        ResponseRate { bytes_per_sec, after_bytes }
    }

    #[tokio::test(start_paused = true)]
    async fn paces_after_the_allowance() {
        let data = Bytes::from(vec![7u8; 40_000]);
        let mut body = Shaped::plain(Full::new(data.clone()));
        body.limit(None, Some(&rate(10_000, 10_000)));
        let t0 = Instant::now();
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected, data, "every byte arrives, in order");
        // 30 000 bytes past the allowance at 10 000 B/s: the last piece is due after ~2.9 s.
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(2_800), "took {took:?}");
        assert!(took <= Duration::from_secs(4), "took {took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_is_unlimited_and_frames_keep_their_order() {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Ok(Frame::data(Bytes::from_static(b""))),
            Ok(Frame::data(Bytes::from_static(b"cd"))),
        ];
        let mut body = Shaped::plain(StreamBody::new(futures_util::stream::iter(frames)));
        body.limit(None, Some(&rate(0, 0)));
        assert!(body.extras.is_none());
        let mut paced = Shaped::plain(Full::new(Bytes::from_static(b"abcd")));
        paced.limit(None, Some(&rate(1, 0)));
        let t0 = Instant::now();
        assert_eq!(paced.collect().await.unwrap().to_bytes(), Bytes::from_static(b"abcd"));
        assert!(t0.elapsed() < Duration::from_secs(1), "one piece of 512 bytes goes at once");
        assert_eq!(body.collect().await.unwrap().to_bytes(), Bytes::from_static(b"abcd"));
    }

    #[tokio::test]
    async fn the_slot_is_freed_at_the_end_and_on_drop() {
        let limiter =
            std::sync::Arc::new(crate::state::connlimit::ConnLimiter::new(&crate::model::ConnLimit {
                max: 5,
                exempt: Vec::new(),
                status: 503,
            }));
        let ip: std::net::IpAddr = "192.0.2.9".parse().unwrap();
        let mut done = Shaped::plain(Full::new(Bytes::from_static(b"x")));
        done.limit(limiter.acquire(ip).unwrap(), None);
        let mut dropped = Shaped::plain(Full::new(Bytes::from_static(b"y")));
        dropped.limit(limiter.acquire(ip).unwrap(), Some(&rate(1000, 0)));
        assert_eq!(limiter.in_flight(ip), 2);
        let mut done = std::pin::pin!(done);
        let _ = done.frame().await.unwrap().unwrap();
        assert_eq!(limiter.in_flight(ip), 1, "freed once the last frame went out");
        drop(dropped);
        assert_eq!(limiter.in_flight(ip), 0, "freed when the body is dropped");
    }
}
