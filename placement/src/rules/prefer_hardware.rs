//! `prefer-hardware`: hosts of the hardware generations an operator names come first, in the order
//! given (say the newest generation first, so that older racks empty out for retirement); hosts of
//! generations not named come last. It reads nothing of the request, so it costs the incremental
//! index nothing per request class.
//!
//! The worked example of adding a rule (`ARCHITECTURE.md`): this file, its `mod` and `pub use`
//! lines in `rules/mod.rs` and its line in [`crate::registry::Registry::standard`]; a policy then
//! names it in TOML:
//!
//! ```toml
//! [allocator.policy]
//! kind = "newest-hardware-first"
//! preferences = [
//!     { rule = "prefer-non-empty" },
//!     { rule = "prefer-hardware", order = ["gen9", "gen8"] },
//!     { rule = "best-fit", buckets = 3 },
//! ]
//! ```

#[cfg(test)]
use super::RequestTraits;
use super::{BuiltRule, HostView, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest};
use serde::Deserialize;

/// See the module documentation.
#[derive(Debug)]
pub struct PreferHardware {
    order: Vec<String>,
}

impl PreferenceRule for PreferHardware {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[]
    }
    /// The generation's position in `order`; generations not named score after all named ones.
    fn score(&self, host: &HostView, _: &RuleRequest) -> u32 {
        let position = self.order.iter().position(|generation| *generation == host.record.hardware);
        position.unwrap_or(self.order.len()) as u32
    }
}

/// The parameters of `prefer-hardware`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreferHardwareParams {
    /// Hardware generations, most preferred first.
    pub order: Vec<String>,
}

impl RegisteredRule for PreferHardware {
    const NAME: &'static str = "prefer-hardware";
    type Params = PreferHardwareParams;
    fn build(params: PreferHardwareParams, _: &RuleContext) -> Result<BuiltRule, String> {
        if params.order.is_empty() {
            return Err("order: name at least one hardware generation, most preferred first".to_owned());
        }
        if let Some(twice) = params.order.iter().enumerate().find(|(i, g)| params.order[..*i].contains(g)) {
            return Err(format!("order: hardware generation `{}` is named twice", twice.1));
        }
        Ok(BuiltRule::Preference(Box::new(PreferHardware { order: params.order }), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifetime::HostLifetime;
    use crate::policy::PolicyConfig;
    use crate::state::{HostIndex, InventoryState};
    use domain::{ClusterId, HostId, InventorySpec, RackId, Resources};
    use std::collections::HashMap;

    fn built(params: serde_json::Value) -> Result<BuiltRule, String> {
        let policy = PolicyConfig::default();
        let context = RuleContext { policy: &policy, compatibility: &HashMap::new() };
        crate::registry::Registry::standard().rule("prefer-hardware").expect("registered")(params, &context)
    }

    #[test]
    fn named_generations_rank_in_order_and_others_last() {
        let Ok(BuiltRule::Preference(rule, None)) = built(serde_json::json!({"order": ["gen9", "gen8"]})) else {
            panic!("a preference rule that reads no lifetime classes")
        };
        // One host per cluster, each cluster of its own generation.
        let mut spec = InventorySpec::homogeneous("z", 1, 1, Resources::from_whole(8.0, 32.0, 0.0).unwrap());
        let template = spec.zones[0].clusters[0].clone();
        spec.zones[0].clusters = ["gen7", "gen8", "gen9"]
            .iter()
            .enumerate()
            .map(|(i, generation)| {
                let mut cluster = template.clone();
                cluster.id = ClusterId(format!("z-c{i}"));
                cluster.hardware = (*generation).to_owned();
                cluster.racks[0].id = RackId(format!("z-r{i}"));
                cluster.racks[0].hosts[0].id = HostId(format!("z-h{i}"));
                cluster
            })
            .collect();
        let state = InventoryState::from_spec(&spec).unwrap();
        let traits = RequestTraits::new(Resources::from_whole(1.0, 1.0, 0.0).unwrap(), 0, "D");
        let request = RuleRequest { traits: &traits, exit_s: 0.0, spread: None };
        let scores: Vec<u32> = (0..3)
            .map(|i| {
                let view = HostView {
                    index: HostIndex(i),
                    record: &state.hosts()[i as usize],
                    lifetime: &HostLifetime::EMPTY,
                };
                rule.score(&view, &request)
            })
            .collect();
        assert_eq!(scores, [2, 1, 0], "gen9 first, gen8 next, the unnamed gen7 last");
    }

    #[test]
    fn bad_parameters_are_refused_with_the_field() {
        assert!(built(serde_json::json!({"order": []})).unwrap_err().starts_with("order:"));
        assert!(built(serde_json::json!({"order": ["a", "a"]})).unwrap_err().contains("named twice"));
        assert!(built(serde_json::json!({"ordr": ["a"]})).unwrap_err().contains("unknown field `ordr`"));
        assert!(built(serde_json::json!({})).unwrap_err().contains("missing field `order`"));
    }
}
