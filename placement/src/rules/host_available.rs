//! `host-available`: the host takes new VMs (not drained for maintenance or defragmentation, not
//! failed). A default validator.

use super::{BuiltRule, HostView, NoParams, RegisteredRule, RequestTrait, RuleContext, RuleRequest, ValidatorRule};
use domain::HostState;

/// The host takes new VMs (not drained for maintenance or defragmentation, not failed).
#[derive(Debug)]
pub struct HostAvailable;

impl ValidatorRule for HostAvailable {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[]
    }
    fn is_valid(&self, host: &HostView, _: &RuleRequest) -> bool {
        host.record.state == HostState::Available
    }
}

impl RegisteredRule for HostAvailable {
    const NAME: &'static str = "host-available";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Validator(Box::new(HostAvailable)))
    }
}
