//! Weighted backend splits ([`RouteAction::Split`](crate::model::RouteAction::Split), Gateway
//! API `backendRefs` with `weight`), compiled: a random draw picks a share by weight; a share
//! without a backend, or a split whose weights are all 0, answers 500 ("the proportion of
//! requests that would otherwise have been routed to an invalid backend MUST receive a 500
//! status code", `HTTPRouteRule.backendRefs`).

use crate::state::balance::BackendIdx;

/// A split, compiled: shares with their cumulative weights.
#[derive(Clone, Debug)]
pub struct CompiledSplit {
    /// `(backend, cumulative weight up to and including it)`; `None`: an unresolved share.
    shares: Box<[(Option<BackendIdx>, u64)]>,
    total: u64,
}

impl CompiledSplit {
    /// Compiles `(backend, weight)` shares; shares of weight 0 are left out.
    pub fn new(shares: impl IntoIterator<Item = (Option<BackendIdx>, u32)>) -> CompiledSplit {
        let mut total = 0u64;
        let shares = shares
            .into_iter()
            .filter(|(_, w)| *w > 0)
            .map(|(b, w)| {
                total += u64::from(w);
                (b, total)
            })
            .collect();
        CompiledSplit { shares, total }
    }

    /// The share a draw `r` (uniform over `u64`) falls in: `Some(backend)`, or `None` for an
    /// unresolved share or a split without weight (both answer 500).
    pub fn pick(&self, r: u64) -> Option<BackendIdx> {
        if self.total == 0 {
            return None;
        }
        let at = r % self.total;
        let i = self.shares.partition_point(|(_, upto)| *upto <= at);
        self.shares.get(i).and_then(|(b, _)| *b)
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
}
