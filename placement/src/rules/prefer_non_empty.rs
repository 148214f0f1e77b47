//! `prefer-non-empty`: non-empty hosts first, so an empty host is opened only when nothing else
//! fits (Protean's `PreferNonEmptyMachines`). The presets' first rule; a configuration's
//! `prefer_non_empty = false` drops it ([`crate::registry::Registry::with_non_empty_switch`]).

use super::{BuiltRule, HostView, NoParams, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest};

/// Non-empty hosts first: an empty host is opened only when nothing else fits.
#[derive(Debug)]
pub struct PreferNonEmpty;

impl PreferenceRule for PreferNonEmpty {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[]
    }
    fn score(&self, host: &HostView, _: &RuleRequest) -> u32 {
        u32::from(host.record.is_empty())
    }
}

impl RegisteredRule for PreferNonEmpty {
    const NAME: &'static str = "prefer-non-empty";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Preference(Box::new(PreferNonEmpty), None))
    }
}
