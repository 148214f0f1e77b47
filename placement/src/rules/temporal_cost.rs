//! `temporal-cost`: NILAS / LAS's temporal cost (paper 000 s4.2), how much later than the host's
//! last VM this VM is predicted to exit, in buckets; the policy's one temporal rule, which the
//! index answers by ranges of host exit times.

use super::{BuiltRule, HostView, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest};
use serde::Deserialize;

/// NILAS / LAS temporal cost (paper 000 s4.2): the bucket of how much later than the host's last VM
/// this VM is predicted to exit, `max(vm_exit - host_exit, 0)`, over its bucket bounds (the paper's
/// [`TemporalCost::BUCKETS_S`] by default). An empty host's exit is minus infinity, so it costs the
/// most.
#[derive(Debug)]
pub struct TemporalCost {
    bounds_s: Vec<f64>,
}

impl Default for TemporalCost {
    fn default() -> Self {
        TemporalCost { bounds_s: Self::BUCKETS_S.to_vec() }
    }
}

impl TemporalCost {
    /// 0, 30 min, 60 min, 90 min, 2 h, 3 h, 4 h, 6 h, 12 h, 24 h, 168 h.
    pub const BUCKETS_S: [f64; 11] =
        [0.0, 1_800.0, 3_600.0, 5_400.0, 7_200.0, 10_800.0, 14_400.0, 21_600.0, 43_200.0, 86_400.0, 604_800.0];

    /// A temporal cost over other bucket bounds: 0 first, then strictly increasing finite
    /// seconds (`None` otherwise).
    pub fn with_bounds(bounds_s: Vec<f64>) -> Option<Self> {
        let valid = bounds_s.first() == Some(&0.0)
            && bounds_s.windows(2).all(|w| w[0] < w[1])
            && bounds_s.iter().all(|b| b.is_finite());
        valid.then_some(TemporalCost { bounds_s })
    }

    /// The paper's cost of a VM exiting at `vm_exit_s` on a host whose VMs exit by `host_exit_s`.
    pub fn cost(vm_exit_s: f64, host_exit_s: f64) -> u32 {
        bucket_of(&Self::BUCKETS_S, vm_exit_s, host_exit_s)
    }
}

/// Index of `max(vm_exit - host_exit, 0)` in increasing `bounds` (the first 0); a VM that exits no
/// later than the host (both infinite included) is in bucket 0.
pub fn bucket_of(bounds: &[f64], vm_exit_s: f64, host_exit_s: f64) -> u32 {
    if vm_exit_s <= host_exit_s || vm_exit_s.is_nan() || host_exit_s.is_nan() {
        return 0;
    }
    let delta = vm_exit_s - host_exit_s;
    (bounds.partition_point(|&b| b <= delta).max(1) - 1) as u32
}

impl PreferenceRule for TemporalCost {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::ExitTime]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        bucket_of(&self.bounds_s, request.exit_s, host.lifetime.exit_s)
    }
    fn exit_buckets(&self) -> Option<&[f64]> {
        Some(&self.bounds_s)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemporalParams {
    /// Bucket bounds in seconds (0 first, increasing); default the policy's `temporal_buckets_s`.
    pub buckets_s: Option<Vec<f64>>,
}

impl RegisteredRule for TemporalCost {
    const NAME: &'static str = "temporal-cost";
    type Params = TemporalParams;
    fn build(params: TemporalParams, context: &RuleContext) -> Result<BuiltRule, String> {
        let (field, bounds) = match params.buckets_s {
            Some(bounds) => ("buckets_s", Some(bounds)),
            None => ("the policy's temporal_buckets_s", context.policy.temporal_buckets_s.clone()),
        };
        let rule = match bounds {
            Some(bounds) => TemporalCost::with_bounds(bounds.clone()).ok_or_else(|| {
                format!("{field}: must start at 0 and increase strictly, in finite seconds; got {bounds:?}")
            })?,
            None => TemporalCost::default(),
        };
        Ok(BuiltRule::Preference(Box::new(rule), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paper 000 s4.2: "if delta T = 70m, the temporal cost is 2".
    #[test]
    fn temporal_cost_follows_the_papers_example() {
        let minute = 60.0;
        assert_eq!(TemporalCost::cost(1_000.0 + 70.0 * minute, 1_000.0), 2);
        assert_eq!(TemporalCost::cost(1_000.0, 5_000.0), 0, "exits before the host: no cost");
        assert_eq!(TemporalCost::cost(29.0 * minute, 0.0), 0);
        assert_eq!(TemporalCost::cost(30.0 * minute, 0.0), 1);
        assert_eq!(TemporalCost::cost(90.0 * minute, 0.0), 3);
        assert_eq!(TemporalCost::cost(1e9, 0.0), 10);
        assert_eq!(TemporalCost::cost(100.0, f64::NEG_INFINITY), 10, "an empty host costs the most");
        assert_eq!(TemporalCost::cost(f64::INFINITY, f64::INFINITY), 0);
        assert_eq!(TemporalCost::cost(f64::INFINITY, 1e6), 10);
    }
}
