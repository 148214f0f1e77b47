//! Dry runs (`POST /v1/explain`): where a VM would go, the best hosts with their scores, and why a
//! given host loses. Nothing changes, not even the tie-breaking sequence.

use super::{rule_request, Allocator};
use crate::policy::ScoreKey;
use crate::rules::{RequestTraits, RuleRequest};
use crate::state::{HostIndex, StateError};
use domain::{HostId, RuleFilterStat, VmRequest};
use serde::{Deserialize, Serialize};

/// One host as `explain` ranks it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RankedHost {
    pub host_id: HostId,
    /// Score under each preference rule, in rule order (lower is better).
    pub scores: Vec<RuleScore>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleScore {
    pub rule: String,
    pub score: u32,
}

/// Why one host was not (or would not be) chosen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostVerdict {
    pub host_id: HostId,
    /// The validator that rejects it, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_by: Option<String>,
    /// The first preference rule on which it scores worse than the best host, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outranked_at: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<RuleScore>,
    pub explanation: String,
}

/// A dry run of one VM's placement (`POST /v1/explain`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Explanation {
    /// The host the allocator would pick now, if any.
    pub would_pick: Option<HostId>,
    /// The VM's lifetime class under the policy.
    pub lifetime_class: u8,
    /// How many hosts tie for the best score.
    pub ties: usize,
    pub top: Vec<RankedHost>,
    pub rule_stats: Vec<RuleFilterStat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<HostVerdict>,
}

impl Allocator {
    /// A dry run: where `vm` would go, the best hosts with their scores and, for `why_not`, why that
    /// host loses. Changes nothing (not even the tie-breaking sequence).
    pub fn explain(
        &mut self,
        vm: &VmRequest,
        why_not: Option<&HostId>,
        top: usize,
        now_s: f64,
    ) -> Result<Explanation, StateError> {
        self.advance_clock(now_s);
        let why_not = why_not
            .map(|id| self.state.host_index(id).ok_or_else(|| StateError::UnknownHostId(id.clone())))
            .transpose()?;
        let selection = self.select(vm, Some(self.chooser.clone()));
        let lifetime = self.policy.classes().vm_lifetime(vm.prediction.as_ref());
        let traits = RequestTraits::of(&vm.facts, lifetime.class, self.policy.read_traits());
        let request = rule_request(&self.state, &self.policy, vm, &traits, lifetime, self.clock_s);
        let ranked = self.rank(&request);
        let top = ranked.iter().take(top).map(|(key, h)| self.ranked(*h, key)).collect();
        let verdict = why_not.map(|host| self.verdict(host, &request, selection.score, selection.host));
        Ok(Explanation {
            would_pick: selection.host.map(|h| self.state.hosts()[h.get()].id.clone()),
            lifetime_class: lifetime.class,
            ties: selection.ties,
            top,
            rule_stats: selection.stats,
            why_not: verdict,
        })
    }

    /// Every valid host for `request`, best first (a full scan and sort: for dry runs; conflict
    /// avoidance reads only the top of it, [`Allocator::rank_top`]).
    pub(super) fn rank(&self, request: &RuleRequest) -> Vec<(ScoreKey, HostIndex)> {
        let mut ranked = self.scored(request);
        ranked.sort_unstable();
        ranked
    }

    /// The start of [`Allocator::rank`]'s list, without sorting the rest: its first `k` hosts and
    /// every host tied by score with the `k`-th (a prefix of the full list, since hosts tied by
    /// score are ordered by index), with the number of valid hosts. Conflict avoidance reads no
    /// further, and with other agents it ranks every placement.
    pub(super) fn rank_top(&self, request: &RuleRequest, k: usize) -> (Vec<(ScoreKey, HostIndex)>, usize) {
        let scored = self.scored(request);
        let valid = scored.len();
        if k == 0 || valid == 0 {
            return (Vec::new(), valid);
        }
        // The k-th best score; a policy of few buckets ties many hosts on it, which need no sort:
        // `scored` is in host order already.
        let mut keys: Vec<ScoreKey> = scored.iter().map(|(key, _)| *key).collect();
        let boundary = *keys.select_nth_unstable(k.min(valid) - 1).1;
        let mut top: Vec<(ScoreKey, HostIndex)> = scored.iter().filter(|(key, _)| *key < boundary).copied().collect();
        top.sort_unstable();
        top.extend(scored.iter().filter(|(key, _)| *key == boundary));
        (top, valid)
    }

    /// Every valid host for `request` with its score, in host order.
    fn scored(&self, request: &RuleRequest) -> Vec<(ScoreKey, HostIndex)> {
        let validators = self.policy.validators().len();
        (0..self.state.hosts().len())
            .map(|i| HostIndex(i as u32))
            .filter(|h| self.policy.first_rejection(&self.view(*h), request, 0..validators).is_none())
            .map(|h| (self.policy.score(&self.view(h), request), h))
            .collect()
    }

    fn ranked(&self, host: HostIndex, key: &ScoreKey) -> RankedHost {
        RankedHost { host_id: self.state.hosts()[host.get()].id.clone(), scores: self.rule_scores(key) }
    }

    fn rule_scores(&self, key: &ScoreKey) -> Vec<RuleScore> {
        self.policy
            .preferences()
            .iter()
            .zip(key)
            .map(|(rule, &score)| RuleScore { rule: rule.name().to_owned(), score })
            .collect()
    }

    fn verdict(
        &self,
        host: HostIndex,
        request: &RuleRequest,
        best: Option<ScoreKey>,
        pick: Option<HostIndex>,
    ) -> HostVerdict {
        let host_id = self.state.hosts()[host.get()].id.clone();
        let view = self.view(host);
        let validators = self.policy.validators();
        if let Some(rule) = self.policy.first_rejection(&view, request, 0..validators.len()) {
            let name = validators[rule].name();
            return HostVerdict {
                host_id,
                rejected_by: Some(name.to_owned()),
                outranked_at: None,
                scores: Vec::new(),
                explanation: format!("validator `{name}` rejects it"),
            };
        }
        let key = self.policy.score(&view, request);
        let scores = self.rule_scores(&key);
        let lost =
            best.and_then(|best| (0..self.policy.preferences().len()).find(|&l| key[l] > best[l]).map(|l| (l, best)));
        match lost {
            Some((level, best)) => {
                let name = self.policy.preferences()[level].name();
                HostVerdict {
                    host_id,
                    rejected_by: None,
                    outranked_at: Some(name.to_owned()),
                    explanation: format!(
                        "it scores {} on `{name}` where the best hosts score {} (lower is better)",
                        key[level], best[level]
                    ),
                    scores,
                }
            }
            None => HostVerdict {
                host_id,
                rejected_by: None,
                outranked_at: None,
                scores,
                explanation: if pick == Some(host) {
                    "it is the host that would be picked".to_owned()
                } else {
                    "it ties with the best hosts; another one was drawn".to_owned()
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::rules::Buckets;
    use crate::{Allocator, AllocatorConfig, PolicyConfig, TieBreak};
    use domain::{AllocationRequest, InventorySpec, Resources, VmRequest};
    use proptest::prelude::*;

    proptest! {
        /// Conflict avoidance reads the start of the ranking from `rank_top`: it must be exactly
        /// the full ranking's first `k` hosts and every host tied with the k-th, so that agents
        /// decide as they did with the full sort.
        #[test]
        fn the_top_of_the_ranking_is_a_prefix_of_the_full_ranking_with_every_tie(
            sizes in prop::collection::vec(1u32..9, 0..60),
            exact in any::<bool>(),
            k in 0usize..40,
        ) {
            let spec = InventorySpec::homogeneous("z", 24, 4, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
            let buckets = if exact { Buckets::Exact } else { Buckets::Quantized(3) };
            let policy = PolicyConfig { buckets, ..PolicyConfig::preset("pbfr") };
            let config = AllocatorConfig { policy, tie_break: TieBreak::LowestIndex, ..Default::default() };
            let mut allocator = Allocator::new(&spec, &config).unwrap();
            for (i, cores) in sizes.iter().enumerate() {
                let vm = VmRequest::new(&format!("v{i}"), "t", "D", Resources::from_whole(f64::from(*cores), 2.0, 0.0).unwrap());
                allocator.allocate(&AllocationRequest::Vm(vm), 1.0).unwrap();
            }
            let probe = VmRequest::new("probe", "t", "D", Resources::from_whole(2.0, 2.0, 0.0).unwrap());
            let traits = allocator.request_traits(&probe);
            let request = allocator.rule_request(&probe, &traits);
            let full = allocator.rank(&request);
            let (top, valid) = allocator.rank_top(&request, k);
            prop_assert_eq!(valid, full.len());
            let expected = match k.min(full.len()) {
                0 => 0,
                n => full.iter().position(|(key, _)| *key > full[n - 1].0).unwrap_or(full.len()),
            };
            prop_assert_eq!(&top[..], &full[..expected]);
        }
    }
}
