//! `dynamic-best-fit`: DPBFR (paper 003 s4.4 V1), best fit with finer buckets for long-lived VMs.

use super::best_fit::{checked_weights, FitParams};
use super::{
    Buckets, BuiltRule, FitWeights, HostView, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest,
};

/// DPBFR (paper 003 s4.4 V1): best fit with finer buckets for long-lived VMs.
#[derive(Debug)]
pub struct DynamicBestFit {
    pub long: Buckets,
    pub short: Buckets,
    pub weights: FitWeights,
}

impl PreferenceRule for DynamicBestFit {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Demand, RequestTrait::LifetimeClass]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        let buckets = if request.lifetime_class > 0 { self.long } else { self.short };
        let record = host.record;
        buckets.quantize(self.weights.leftover_share(&record.capacity, &record.free(), &request.demand))
    }
}

impl RegisteredRule for DynamicBestFit {
    const NAME: &'static str = "dynamic-best-fit";
    type Params = FitParams;
    fn build(params: FitParams, context: &RuleContext) -> Result<BuiltRule, String> {
        if params.buckets.is_some() {
            return Err("`dynamic-best-fit` takes long_buckets and short_buckets, not buckets".to_owned());
        }
        let rule = DynamicBestFit {
            long: params.long_buckets.unwrap_or(context.policy.long_buckets),
            short: params.short_buckets.unwrap_or(context.policy.short_buckets),
            weights: checked_weights(params.weights.unwrap_or(context.policy.weights))?,
        };
        Ok(BuiltRule::Preference(Box::new(rule), Some(context.binary_classes()?)))
    }
}
