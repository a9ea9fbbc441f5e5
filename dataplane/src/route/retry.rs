//! `proxy-next-upstream`: the conditions under which a request goes to the next endpoint, as a
//! bit set compiled from the table's list.
//!
//! A request that was not sent (connecting failed) may always go again, whatever its method; one
//! that was sent goes again only when its method is idempotent (or `non_idempotent` is listed)
//! and its body can be sent again (see `forward`).

use std::time::Duration;

use http::{Method, StatusCode};

use crate::model::RetryOn;

/// A set of [`RetryOn`] conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry(u16);

const fn bit(on: RetryOn) -> u16 {
    1 << on as u16
}

impl Retry {
    /// ingress-nginx's default: `error timeout`.
    pub const DEFAULT: Retry = Retry(bit(RetryOn::Error) | bit(RetryOn::Timeout));

    /// The set of `on` (empty: `off`).
    pub fn new(on: &[RetryOn]) -> Retry {
        Retry(on.iter().fold(0, |set, c| set | bit(*c)))
    }

    /// This set, with `non_idempotent` added when `yes` (`retry-non-idempotent`).
    pub fn with_non_idempotent(self, yes: bool) -> Retry {
        if yes { Retry(self.0 | bit(RetryOn::NonIdempotent)) } else { self }
    }

    /// Whether `on` is in the set.
    pub fn on(self, on: RetryOn) -> bool {
        self.0 & bit(on) != 0
    }

    /// Whether an answer with `status` goes to the next endpoint.
    pub fn on_status(self, status: StatusCode) -> bool {
        let on = match status.as_u16() {
            500 => RetryOn::Http500,
            502 => RetryOn::Http502,
            503 => RetryOn::Http503,
            504 => RetryOn::Http504,
            403 => RetryOn::Http403,
            404 => RetryOn::Http404,
            429 => RetryOn::Http429,
            _ => return false,
        };
        self.on(on)
    }

    /// Whether a request with `method` may be sent again once it was sent: idempotent methods
    /// (RFC 9110 §9.2.2), others only with `non_idempotent`.
    pub fn may_resend(self, method: &Method) -> bool {
        self.on(RetryOn::NonIdempotent)
            || matches!(
                *method,
                Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
            )
    }

    /// Whether any condition other than a failed connect can send a request again.
    pub fn after_send(self) -> bool {
        self.0 & !bit(RetryOn::NonIdempotent) != 0
    }
}

/// Gateway API `HTTPRouteRetry`, compiled: the statuses retried (a bit per status from 400 to
/// 599), the retries and the wait before each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retries {
    codes: [u64; 4],
    /// Retries after the first try.
    pub attempts: u32,
    /// Least wait before each retry.
    pub backoff: Duration,
    /// The tries together (`timeouts.request`).
    pub request_timeout: Option<Duration>,
}

impl Retries {
    /// From the table's; statuses outside 400 to 599 are ignored (translation refuses them).
    pub fn new(r: &crate::model::filters::Retries) -> Retries {
        let mut codes = [0u64; 4];
        for code in r.codes.iter().filter(|c| (400..=599).contains(*c)) {
            let bit = usize::from(code - 400);
            codes[bit / 64] |= 1 << (bit % 64);
        }
        Retries {
            codes,
            attempts: r.attempts,
            backoff: Duration::from_millis(r.backoff_ms),
            request_timeout: r.request_timeout_ms.map(Duration::from_millis),
        }
    }

    /// Whether an answer with `status` is retried.
    pub fn on_status(&self, status: StatusCode) -> bool {
        let Some(bit) = status.as_u16().checked_sub(400).map(usize::from).filter(|b| *b < 200) else {
            return false;
        };
        self.codes[bit / 64] & (1 << (bit % 64)) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `HTTPRouteRetryStatusCode`: "Implementations MUST support the following status codes as
    /// retriable: 500 502 503 504", and "MAY support" others from 400 to 599.
    #[test]
    fn gateway_retry_codes() {
        let r = Retries::new(&crate::model::filters::Retries {
            codes: vec![400, 463, 500, 503, 599, 600],
            attempts: 2,
            backoff_ms: 5,
            request_timeout_ms: None,
        });
        for (code, retried) in [
            (400, true),
            (463, true),
            (500, true),
            (503, true),
            (599, true),
            (502, false),
            (404, false),
            (200, false),
        ] {
            assert_eq!(r.on_status(StatusCode::from_u16(code).unwrap()), retried, "{code}");
        }
        assert_eq!((r.attempts, r.backoff), (2, Duration::from_millis(5)));
    }

    #[test]
    fn conditions_and_methods() {
        let d = Retry::DEFAULT;
        assert!(d.on(RetryOn::Error) && d.on(RetryOn::Timeout) && !d.on(RetryOn::InvalidHeader));
        assert!(!d.on_status(StatusCode::BAD_GATEWAY));
        assert!(d.may_resend(&Method::PUT) && !d.may_resend(&Method::POST) && !d.may_resend(&Method::PATCH));
        let set = Retry::new(&[RetryOn::Http502, RetryOn::Http429]);
        assert!(set.on_status(StatusCode::BAD_GATEWAY) && set.on_status(StatusCode::TOO_MANY_REQUESTS));
        assert!(!set.on_status(StatusCode::INTERNAL_SERVER_ERROR) && !set.on(RetryOn::Error));
        assert!(set.with_non_idempotent(true).may_resend(&Method::POST));
        let off = Retry::new(&[]);
        assert!(!off.after_send() && !off.on(RetryOn::Error));
        assert!(!off.with_non_idempotent(true).after_send());
    }
}
