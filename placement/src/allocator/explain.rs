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

    /// Every valid host for `request`, best first (a full scan: for dry runs and conflict
    /// avoidance, not the decision path).
    pub(super) fn rank(&self, request: &RuleRequest) -> Vec<(ScoreKey, HostIndex)> {
        let validators = self.policy.validators().len();
        let mut ranked: Vec<(ScoreKey, HostIndex)> = (0..self.state.hosts().len())
            .map(|i| HostIndex(i as u32))
            .filter(|h| self.policy.first_rejection(&self.view(*h), request, 0..validators).is_none())
            .map(|h| (self.policy.score(&self.view(h), request), h))
            .collect();
        ranked.sort_unstable();
        ranked
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
