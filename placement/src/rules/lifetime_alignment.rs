//! `lifetime-alignment`: LAR (paper 003 Alg. 2 as a rule), a VM above class 0 prefers hosts of
//! its own lifetime class, over two classes (LA-binary) or the interval model's (LA-multiclass).

use super::{BuiltRule, HostView, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest};
use serde::{Deserialize, Serialize};

/// Lifetime alignment (LAR, paper 003 Alg. 2 as a rule): a VM above class 0 prefers hosts of its own
/// class; class-0 VMs have no preference.
#[derive(Debug)]
pub struct LifetimeAlignment;

impl PreferenceRule for LifetimeAlignment {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::LifetimeClass]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        u32::from(
            request.lifetime_class != 0 && (host.record.is_empty() || host.lifetime.class != request.lifetime_class),
        )
    }
}

/// Which lifetime classes `lifetime-alignment` aligns VMs by.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassChoice {
    /// Short and long, split at the policy's `long_threshold_s` (LA-binary).
    #[default]
    Binary,
    /// The policy's `class_cutoffs_s`, the lifetime-interval model's classes (LA-multiclass).
    Intervals,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlignmentParams {
    #[serde(default)]
    pub classes: ClassChoice,
}

impl RegisteredRule for LifetimeAlignment {
    const NAME: &'static str = "lifetime-alignment";
    type Params = AlignmentParams;
    fn build(params: AlignmentParams, context: &RuleContext) -> Result<BuiltRule, String> {
        let classes = match params.classes {
            ClassChoice::Binary => context.binary_classes()?,
            ClassChoice::Intervals => context.interval_classes()?,
        };
        Ok(BuiltRule::Preference(Box::new(LifetimeAlignment), Some(classes)))
    }
}
