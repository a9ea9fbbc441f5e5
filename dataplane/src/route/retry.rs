//! `proxy-next-upstream`: the conditions under which a request goes to the next endpoint, as a
//! bit set compiled from the table's list.
//!
//! A request that was not sent (connecting failed) may always go again, whatever its method; one
//! that was sent goes again only when its method is idempotent (or `non_idempotent` is listed)
//! and its body can be sent again (see `forward`).

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

#[cfg(test)]
mod tests {
    use super::*;

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
