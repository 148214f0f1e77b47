//! `best-fit`: Prefer Best Fit (PBFR, Protean): the weighted leftover after placement, quantized
//! into the policy's buckets.

use super::{
    Buckets, BuiltRule, FitWeights, HostView, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest,
};
use serde::Deserialize;

/// Prefer Best Fit (PBFR): the weighted leftover after placement, quantized.
#[derive(Debug)]
pub struct BestFit {
    pub buckets: Buckets,
    pub weights: FitWeights,
}

impl PreferenceRule for BestFit {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Demand]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        let record = host.record;
        self.buckets.quantize(self.weights.leftover_share(&record.capacity, &record.free(), &request.demand))
    }
}

/// `best-fit` and `dynamic-best-fit` default to the policy's buckets and weights.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitParams {
    pub buckets: Option<Buckets>,
    pub long_buckets: Option<Buckets>,
    pub short_buckets: Option<Buckets>,
    pub weights: Option<FitWeights>,
}

/// The weights a fit rule is given, refused when none is positive or any is negative or not finite.
pub(super) fn checked_weights(weights: FitWeights) -> Result<FitWeights, String> {
    let all = [weights.cores, weights.memory_gib, weights.ssd_gib];
    if all.iter().any(|w| !w.is_finite() || *w < 0.0) || all.iter().all(|w| *w == 0.0) {
        return Err("weights: at least one weight must be positive, and none negative or non-finite".to_owned());
    }
    Ok(weights)
}

impl RegisteredRule for BestFit {
    const NAME: &'static str = "best-fit";
    type Params = FitParams;
    fn build(params: FitParams, context: &RuleContext) -> Result<BuiltRule, String> {
        if params.long_buckets.is_some() || params.short_buckets.is_some() {
            return Err("long_buckets and short_buckets belong to `dynamic-best-fit`".to_owned());
        }
        let weights = checked_weights(params.weights.unwrap_or(context.policy.weights))?;
        let buckets = params.buckets.unwrap_or(context.policy.buckets);
        Ok(BuiltRule::Preference(Box::new(BestFit { buckets, weights }), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::Resources;

    #[test]
    fn quantization_follows_protean() {
        assert_eq!(Buckets::Quantized(3).quantize(0.0), 0);
        assert_eq!(Buckets::Quantized(3).quantize(0.2), 1);
        assert_eq!(Buckets::Quantized(3).quantize(0.34), 2);
        assert_eq!(Buckets::Quantized(3).quantize(1.0), 3);
        assert!(Buckets::Exact.quantize(0.3) < Buckets::Exact.quantize(0.3000001));
    }

    #[test]
    fn buckets_parse_from_numbers_or_exact() {
        #[derive(Deserialize)]
        struct W {
            b: Buckets,
        }
        assert_eq!(toml::from_str::<W>("b = 5").unwrap().b, Buckets::Quantized(5));
        assert_eq!(toml::from_str::<W>("b = \"exact\"").unwrap().b, Buckets::Exact);
        assert!(toml::from_str::<W>("b = 0").is_err());
        assert!(toml::from_str::<W>("b = \"fine\"").is_err());
    }

    #[test]
    fn leftover_share_weighs_dimensions() {
        let cap = Resources::from_whole(48.0, 384.0, 0.0).unwrap();
        let weights = FitWeights::default();
        let full = weights.leftover_share(&cap, &cap, &cap);
        assert_eq!(full, 0.0);
        let half_cores = Resources::from_whole(24.0, 384.0, 0.0).unwrap();
        let share = weights.leftover_share(&cap, &cap, &half_cores);
        assert!((share - 2.0 / 3.0 * 0.5).abs() < 1e-12, "{share}");
    }
}
