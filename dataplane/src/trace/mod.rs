//! OpenTelemetry tracing: the W3C trace context ([`context`]) and the sampler ([`Sampler`]).

pub mod context;

use context::{TraceId, TraceParent};

/// Which new traces are recorded (`otel-sampler`, `otel-sampler-ratio`,
/// `otel-sampler-parent-based`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    /// Share of traces recorded, 0 to 1 (`AlwaysOn` is 1, `AlwaysOff` 0).
    pub ratio: f64,
    /// A request continuing a trusted trace follows its caller's `sampled` flag instead.
    pub parent_based: bool,
}

impl Sampler {
    /// Whether the span of a request in `trace_id` is recorded; `parent` is the trusted
    /// incoming context, if any.
    pub fn sampled(&self, trace_id: TraceId, parent: Option<&TraceParent>) -> bool {
        match parent {
            Some(p) if self.parent_based => p.sampled,
            _ => ratio_sampled(self.ratio, trace_id),
        }
    }
}

/// OpenTelemetry's `TraceIdRatioBased`: the trace's last 8 bytes, as a 63-bit number, below
/// `ratio` of the range. Deterministic per trace id, so every hop using the same ratio takes the
/// same decision.
fn ratio_sampled(ratio: f64, trace_id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio.is_nan() || ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id.0[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    // `ratio` is in (0, 1): the product fits in 63 bits.
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    x < bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use context::SpanId;

    #[test]
    fn ratio_sampling_takes_about_its_share() {
        let ids: Vec<TraceId> = (0..20_000).map(|_| TraceId::random()).collect();
        let taken = |ratio: f64| {
            let s = Sampler { ratio, parent_based: false };
            ids.iter().filter(|id| s.sampled(**id, None)).count()
        };
        assert_eq!(taken(0.0), 0);
        assert_eq!(taken(1.0), ids.len());
        let quarter = taken(0.25);
        assert!((4_000..6_000).contains(&quarter), "{quarter} of 20000 at 0.25");
        // The decision belongs to the trace id: a smaller ratio samples a subset.
        let s10 = Sampler { ratio: 0.1, parent_based: false };
        let s50 = Sampler { ratio: 0.5, parent_based: false };
        assert!(ids.iter().filter(|id| s10.sampled(**id, None)).all(|id| s50.sampled(*id, None)));
    }

    #[test]
    fn parent_based_follows_the_caller() {
        let parent =
            |sampled| TraceParent { trace_id: TraceId::random(), parent_id: SpanId::random(), sampled };
        let on = Sampler { ratio: 1.0, parent_based: true };
        let off = Sampler { ratio: 0.0, parent_based: true };
        assert!(!on.sampled(TraceId::random(), Some(&parent(false))));
        assert!(off.sampled(TraceId::random(), Some(&parent(true))));
        // Without a parent the ratio decides.
        assert!(on.sampled(TraceId::random(), None));
        assert!(!off.sampled(TraceId::random(), None));
        // Not parent-based: the caller's flag is ignored.
        let ratio_only = Sampler { ratio: 0.0, parent_based: false };
        assert!(!ratio_only.sampled(TraceId::random(), Some(&parent(true))));
    }
}
