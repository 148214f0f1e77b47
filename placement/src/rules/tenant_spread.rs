//! `tenant-spread`: at most K VMs of the tenant per rack, when the request asks for it. A default
//! validator; it reads the tenant, so the index applies it on top of a class's cached order.

use super::{BuiltRule, HostView, NoParams, RegisteredRule, RequestTrait, RuleContext, RuleRequest, ValidatorRule};
use crate::state::{HostIndex, InventoryState};

/// At most K VMs of the tenant per rack, when the request asks for it.
#[derive(Debug)]
pub struct TenantSpreadRule;

impl ValidatorRule for TenantSpreadRule {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Tenant]
    }
    fn is_valid(&self, host: &HostView, request: &RuleRequest) -> bool {
        request.spread.is_none_or(|spread| {
            spread.vms_per_rack.get(&host.record.rack_index).copied().unwrap_or(0) < spread.max_per_rack
        })
    }

    fn rejected_hosts(&self, request: &RuleRequest, state: &InventoryState) -> Option<Vec<HostIndex>> {
        let Some(spread) = request.spread else { return Some(Vec::new()) };
        Some(
            spread
                .vms_per_rack
                .iter()
                .filter(|(_, &count)| count >= spread.max_per_rack)
                .flat_map(|(&rack, _)| state.rack_hosts(rack).iter().copied())
                .collect(),
        )
    }
}

impl RegisteredRule for TenantSpreadRule {
    const NAME: &'static str = "tenant-spread";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Validator(Box::new(TenantSpreadRule)))
    }
}
