//! The request body sent upstream ([`UpstreamBody`]) and the tee that hands its frames to the
//! mirrored copies as they pass ([`UpstreamBody::tee`]).
//!
//! However many copies a request has, its body is read once and held once: each copy's
//! channel holds references to the same frames (`Bytes`, reference-counted), so the memory a
//! request's copies hold is at most [`crate::proxy::mirror::LAG_FRAMES`] frames of its body,
//! shared, not that per copy.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::mpsc;

use super::conn::BoxError;
use crate::stall::Stall;

// === impl UpstreamBody ===

/// The client's request body passed the route's size limit (`proxy-body-size`): 413.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {0} bytes")]
pub(crate) struct BodyTooLarge(u64);

/// The client's request body stopped arriving for longer than `client-body-timeout`: 408.
#[derive(Debug, thiserror::Error)]
#[error("no request body data for {0:?} (client-body-timeout)")]
pub(crate) struct BodyTimedOut(std::time::Duration);

/// The request body sent upstream: the client's body, streamed frame by frame, or a small body
/// read whole beforehand so that a retry can send it again ([`UpstreamBody::buffered`]).
pub(crate) struct UpstreamBody {
    body: Option<Incoming>,
    limit: Option<u64>,
    seen: u64,
    /// Longest wait for the client's next frame, in milliseconds (`client-body-timeout`; 0: no
    /// limit), and the wait in progress.
    idle_ms: u32,
    stall: Stall,
    /// A whole body, sent as one frame.
    buffered: Option<Bytes>,
    /// `mirror-*`: on a request's body, the copies its frames go to; on a copy's body (no
    /// `body`), where its frames come from. Boxed: rare, and every request carries this type.
    mirror: Option<Box<Side>>,
    /// Where the data bytes read from the client are added (`$request_length` of a body of
    /// undeclared length).
    counted: Option<Arc<AtomicU64>>,
}

impl UpstreamBody {
    /// Streams `body`; one longer than `limit` bytes fails with [`BodyTooLarge`] once it passes
    /// the limit.
    /// A client that sends nothing for `idle` fails it with [`BodyTimedOut`].
    pub(crate) fn new(body: Incoming, limit: Option<u64>, idle: std::time::Duration) -> Self {
        if body.is_end_stream() {
            return UpstreamBody::empty();
        }
        let idle_ms = u32::try_from(idle.as_millis()).unwrap_or(u32::MAX);
        UpstreamBody { body: Some(body), limit, idle_ms, ..UpstreamBody::empty() }
    }

    /// An empty body.
    pub(crate) fn empty() -> Self {
        UpstreamBody {
            body: None,
            limit: None,
            seen: 0,
            idle_ms: 0,
            stall: Stall::default(),
            buffered: None,
            mirror: None,
            counted: None,
        }
    }

    /// Adds the data bytes read from the client to `counter` as they pass.
    pub(crate) fn count_into(&mut self, counter: Arc<AtomicU64>) {
        self.counted = Some(counter);
    }

    /// A body read whole beforehand.
    pub(crate) fn buffered(bytes: Bytes) -> Self {
        UpstreamBody { buffered: (!bytes.is_empty()).then_some(bytes), ..UpstreamBody::empty() }
    }

    /// The whole body, when it was read beforehand (and nothing of it was sent yet).
    pub(crate) fn whole(&self) -> Option<&Bytes> {
        if self.body.is_some() || self.mirror.is_some() {
            return None;
        }
        self.buffered.as_ref()
    }

    /// Marks the whole body ([`UpstreamBody::whole`]) as sent.
    pub(crate) fn take_whole(&mut self) {
        self.buffered = None;
    }

    /// From now on this body's data frames also go to the body returned, which may lag `lag`
    /// frames behind before it is cut off (with an error, as when this body fails or is dropped
    /// before its end). Called again, it adds another copy fed the same frames (shared, not
    /// copied). A body read whole beforehand is simply shared.
    pub(crate) fn tee(&mut self, lag: usize) -> UpstreamBody {
        if self.body.is_none()
            && let Some(bytes) = &self.buffered
        {
            return UpstreamBody::buffered(bytes.clone());
        }
        let (tee, feed) = channel(lag, self.size_hint());
        match self.mirror.as_deref_mut() {
            Some(Side::Tees(tees)) => tees.push(tee),
            _ => self.mirror = Some(Box::new(Side::Tees(vec![tee]))),
        }
        UpstreamBody { mirror: Some(Box::new(Side::Feed(feed))), ..UpstreamBody::empty() }
    }

    /// The copies' share of a frame that passed: a copy that cannot keep up is cut off (the
    /// others go on); at the body's end they end too.
    fn tee_frame(&mut self, data: Option<&Bytes>, at_end: bool) {
        let Some(Side::Tees(tees)) = self.mirror.as_deref_mut() else { return };
        if let Some(data) = data {
            tees.retain(|tee| tee.offer(data));
        }
        if tees.is_empty() {
            self.mirror = None;
        } else if at_end
            && let Some(side) = self.mirror.take()
            && let Side::Tees(tees) = *side
        {
            tees.into_iter().for_each(Tee::finish);
        }
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").field("limit", &self.limit).field("seen", &self.seen).finish()
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(bytes) = this.buffered.take() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        let Some(body) = &mut this.body else {
            return match this.mirror.as_deref_mut() {
                Some(Side::Feed(feed)) => feed.poll_frame(cx),
                _ => Poll::Ready(None),
            };
        };
        let polled = Pin::new(&mut *body).poll_frame(cx);
        if polled.is_pending() {
            let idle = std::time::Duration::from_millis(u64::from(this.idle_ms));
            ready!(this.stall.poll_expired(cx, idle));
            this.mirror = None;
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut(idle)))));
        }
        this.stall.progressed();
        let frame = match ready!(polled) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                this.mirror = None;
                return Poll::Ready(Some(Err(Box::new(e))));
            }
            None => {
                this.tee_frame(None, true);
                return Poll::Ready(None);
            }
        };
        if let (Some(counter), Some(data)) = (&this.counted, frame.data_ref()) {
            counter.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        if let (Some(limit), Some(data)) = (this.limit, frame.data_ref()) {
            this.seen = this.seen.saturating_add(data.len() as u64);
            if this.seen > limit {
                this.mirror = None;
                return Poll::Ready(Some(Err(Box::new(BodyTooLarge(limit)))));
            }
        }
        if this.mirror.is_some() {
            // A body of known length is not polled past its last frame.
            let at_end = body.is_end_stream();
            this.tee_frame(frame.data_ref(), at_end);
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        if self.buffered.is_some() {
            return false;
        }
        match &self.body {
            Some(body) => body.is_end_stream(),
            None => !matches!(self.mirror.as_deref(), Some(Side::Feed(_))),
        }
    }

    fn size_hint(&self) -> SizeHint {
        if let Some(bytes) = &self.buffered {
            return SizeHint::with_exact(bytes.len() as u64);
        }
        match (&self.body, self.mirror.as_deref()) {
            (Some(body), _) => body.size_hint(),
            (None, Some(Side::Feed(feed))) => feed.size_hint(),
            (None, _) => SizeHint::with_exact(0),
        }
    }
}

// === impl Tee ===

/// The copies' side of a request body: the request's body hands each data frame to its copies.
pub(crate) enum Side {
    /// On the request's body: where its frames are offered, one tee per copy.
    Tees(Vec<Tee>),
    /// The copy's body, fed by the request's.
    Feed(Feed),
}

/// Hands frames to a copy's [`Feed`]; dropped without [`Tee::finish`], the copy is aborted.
pub(crate) struct Tee {
    tx: mpsc::Sender<Bytes>,
    complete: Arc<AtomicBool>,
}

/// A copy's body: the frames of the request's body, then its end (or an error if the request's
/// body did not end properly).
pub(crate) struct Feed {
    rx: mpsc::Receiver<Bytes>,
    complete: Arc<AtomicBool>,
    hint: SizeHint,
}

/// A tee and the feed it fills, with room for `lag` frames; `hint` is the request body's size.
pub(crate) fn channel(lag: usize, hint: SizeHint) -> (Tee, Feed) {
    let (tx, rx) = mpsc::channel(lag.max(1));
    let complete = Arc::new(AtomicBool::new(false));
    (Tee { tx, complete: complete.clone() }, Feed { rx, complete, hint })
}

impl Tee {
    /// Offers a data frame; `false` when the copy fell behind or is gone (drop the tee).
    pub(crate) fn offer(&self, data: &Bytes) -> bool {
        self.tx.try_send(data.clone()).is_ok()
    }

    /// The request's body ended properly: the copy's ends too.
    pub(crate) fn finish(self) {
        self.complete.store(true, Ordering::Release);
    }
}

/// The request's body failed or stopped before its end, or the copy fell behind.
#[derive(Debug, thiserror::Error)]
#[error("the mirrored request's body did not end properly")]
pub(crate) struct CutShort;

impl Feed {
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            // The sender is gone: the request's body ended, or was abandoned.
            Poll::Ready(None) if self.complete.load(Ordering::Acquire) => Poll::Ready(None),
            Poll::Ready(None) => Poll::Ready(Some(Err(Box::new(CutShort)))),
            Poll::Pending => Poll::Pending,
        }
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::future::poll_fn;

    #[tokio::test]
    async fn a_finished_tee_ends_the_feed_and_a_dropped_one_cuts_it_short() {
        let (tee, mut feed) = channel(2, SizeHint::with_exact(3));
        assert!(tee.offer(&Bytes::from_static(b"ab")));
        assert!(tee.offer(&Bytes::from_static(b"c")));
        assert!(!tee.offer(&Bytes::from_static(b"d")), "a third frame overflows a lag of 2");
        tee.finish();
        let mut got = Vec::new();
        while let Some(frame) = poll_fn(|cx| feed.poll_frame(cx)).await {
            got.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(got, b"abc");

        let (tee, mut feed) = channel(2, SizeHint::default());
        assert!(tee.offer(&Bytes::from_static(b"ab")));
        drop(tee);
        assert!(poll_fn(|cx| feed.poll_frame(cx)).await.unwrap().is_ok());
        assert!(poll_fn(|cx| feed.poll_frame(cx)).await.unwrap().is_err(), "an abandoned body is an error");
    }

    /// Two copies of one body (Gateway API `RequestMirror` repeated): both are fed the very
    /// same frames (shared, not copied); the one that falls behind is cut off alone.
    #[tokio::test]
    async fn copies_share_the_frames_and_a_lagging_one_is_cut_off_alone() {
        let mut body = UpstreamBody::empty();
        let mut keeps_up = body.tee(4);
        let mut lags = body.tee(1);
        let first = Bytes::from(vec![b'a'; 64]);
        body.tee_frame(Some(&first), false);
        body.tee_frame(Some(&Bytes::from_static(b"b")), false);
        body.tee_frame(Some(&Bytes::from_static(b"c")), true);
        let mut got = Vec::new();
        while let Some(frame) = keeps_up.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            if got.is_empty() {
                assert_eq!(data.as_ptr(), first.as_ptr(), "the copy holds the request's own frame");
            }
            got.extend_from_slice(&data);
        }
        assert_eq!(got.len(), 66);
        assert_eq!(&got[64..], b"bc");
        let data = lags.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(data.as_ptr(), first.as_ptr());
        assert!(lags.frame().await.unwrap().is_err(), "the lagging copy is cut short");
    }
}
