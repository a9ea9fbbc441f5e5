//! Weighted backend splits ([`RouteAction::Split`](crate::model::RouteAction::Split), Gateway
//! API `backendRefs` with `weight`), compiled: a random draw picks a share by weight; a share
//! without a backend, or a split whose weights are all 0, answers 500 ("the proportion of
//! requests that would otherwise have been routed to an invalid backend MUST receive a 500
//! status code", `HTTPRouteRule.backendRefs`). A share may carry its own request header edits
//! (`HTTPBackendRef.filters`), applied only to the requests it gets.

use crate::route::filters::CompiledEdits;
use crate::state::balance::BackendIdx;

/// A split, compiled: shares with their cumulative weights.
#[derive(Clone, Debug)]
pub struct CompiledSplit {
    /// `(backend, cumulative weight up to and including it)`; `None`: an unresolved share.
    shares: Box<[(Option<BackendIdx>, u64)]>,
    /// Each share's request header edits, beside `shares`; empty when no share has any.
    edits: Box<[Option<CompiledEdits>]>,
    total: u64,
}

impl CompiledSplit {
    /// Compiles `(backend, weight)` shares; shares of weight 0 are left out.
    pub fn new(shares: impl IntoIterator<Item = (Option<BackendIdx>, u32)>) -> CompiledSplit {
        Self::with_edits(shares.into_iter().map(|(b, w)| (b, w, None)))
    }

    /// Compiles `(backend, weight, request header edits)` shares; shares of weight 0 are left
    /// out.
    pub fn with_edits(
        shares: impl IntoIterator<Item = (Option<BackendIdx>, u32, Option<CompiledEdits>)>,
    ) -> CompiledSplit {
        let mut total = 0u64;
        let mut edits = Vec::new();
        let shares = shares
            .into_iter()
            .filter(|(_, w, _)| *w > 0)
            .map(|(b, w, e)| {
                total += u64::from(w);
                edits.push(e);
                (b, total)
            })
            .collect();
        if edits.iter().all(Option::is_none) {
            edits.clear();
        }
        CompiledSplit { shares, edits: edits.into(), total }
    }

    /// The share a draw `r` (uniform over `u64`) falls in: `Some(backend)`, or `None` for an
    /// unresolved share or a split without weight (both answer 500).
    pub fn pick(&self, r: u64) -> Option<BackendIdx> {
        self.pick_share(r).map(|(b, _)| b)
    }

    /// As [`pick`](Self::pick), with the request header edits of the share picked.
    pub fn pick_share(&self, r: u64) -> Option<(BackendIdx, Option<&CompiledEdits>)> {
        if self.total == 0 {
            return None;
        }
        let at = r % self.total;
        let i = self.shares.partition_point(|(_, upto)| *upto <= at);
        let backend = self.shares.get(i).and_then(|(b, _)| *b)?;
        Some((backend, self.edits.get(i).and_then(Option::as_ref)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `HTTPBackendRef.weight`: "Weight specifies the proportion of requests forwarded to the
    /// referenced backend ... computed as weight/(sum of all weights in this BackendRefs list)";
    /// "If only one backend is specified and it has a weight greater than 0, 100% of the
    /// traffic is forwarded to that backend. If weight is set to 0, no traffic should be
    /// forwarded for this entry."
    #[test]
    fn backendref_weight_proportions_and_zero_excluded() {
        let s = CompiledSplit::new([
            (Some(BackendIdx(0)), 1),
            (Some(BackendIdx(1)), 0),
            (Some(BackendIdx(2)), 3),
        ]);
        let mut counts = [0u32; 3];
        for r in 0..4000u64 {
            counts[s.pick(r).unwrap().0 as usize] += 1;
        }
        assert_eq!(counts, [1000, 0, 3000]);
    }

    /// `HTTPRouteRule.backendRefs`: "if two backends are specified with equal weights, and one
    /// is invalid, 50 percent of traffic must receive a 500".
    #[test]
    fn unresolved_share_answers_500_for_its_proportion() {
        let s = CompiledSplit::new([(Some(BackendIdx(0)), 1), (None, 1)]);
        let errors = (0..1000u64).filter(|r| s.pick(*r).is_none()).count();
        assert_eq!(errors, 500);
        assert_eq!(CompiledSplit::new([]).pick(7), None);
        assert_eq!(CompiledSplit::new([(Some(BackendIdx(0)), 0)]).pick(7), None);
    }

    /// `HTTPBackendRef.filters`: "Filters defined at this level should be executed if and only
    /// if the request is being forwarded to the backend defined here": each share's edits come
    /// with that share only (a share of weight 0 drops out with its edits).
    #[test]
    fn backendref_filters_come_with_their_share() {
        let edits = |v: &str| {
            let e = crate::model::filters::HeaderEdits {
                set: vec![("backend".into(), v.into())],
                ..Default::default()
            };
            Some(CompiledEdits::compile(&e).unwrap())
        };
        let s = CompiledSplit::with_edits([
            (Some(BackendIdx(0)), 1, edits("zero")),
            (Some(BackendIdx(1)), 0, edits("never")),
            (Some(BackendIdx(2)), 1, None),
            (Some(BackendIdx(3)), 1, edits("three")),
        ]);
        for r in 0..300u64 {
            let (b, e) = s.pick_share(r).unwrap();
            let mut h = http::HeaderMap::new();
            if let Some(e) = e {
                e.apply(&mut h);
            }
            let want = match b.0 {
                0 => Some("zero"),
                2 => None,
                3 => Some("three"),
                other => panic!("share {other} picked"),
            };
            assert_eq!(h.get("backend").map(|v| v.to_str().unwrap()), want, "share {}", b.0);
        }
        let plain = CompiledSplit::new([(Some(BackendIdx(0)), 1)]);
        assert!(plain.edits.is_empty());
        assert_eq!(plain.pick_share(1).map(|(b, e)| (b, e.is_none())), Some((BackendIdx(0), true)));
    }
}
