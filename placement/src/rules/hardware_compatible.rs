//! `hardware-compatible`: the VM type runs on the host's hardware generation (the allocator's
//! `compatibility` table). A default validator when the table lists any type.

use super::{BuiltRule, HostView, RegisteredRule, RequestTrait, RuleContext, RuleRequest, ValidatorRule};
use serde::Deserialize;
use std::collections::HashMap;

/// The VM type runs on the host's hardware generation. Types not listed run everywhere.
#[derive(Debug)]
pub struct HardwareCompatible {
    /// VM type -> hardware generations it runs on.
    pub allowed: HashMap<String, Vec<String>>,
}

impl ValidatorRule for HardwareCompatible {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::VmType]
    }
    fn is_valid(&self, host: &HostView, request: &RuleRequest) -> bool {
        self.allowed.get(&request.vm_type).is_none_or(|generations| generations.contains(&host.record.hardware))
    }
}

/// `hardware-compatible` reads the allocator's `compatibility` table unless given its own.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompatibilityParams {
    pub allowed: Option<HashMap<String, Vec<String>>>,
}

impl RegisteredRule for HardwareCompatible {
    const NAME: &'static str = "hardware-compatible";
    type Params = CompatibilityParams;
    fn build(params: CompatibilityParams, context: &RuleContext) -> Result<BuiltRule, String> {
        let allowed = params.allowed.unwrap_or_else(|| context.compatibility.clone());
        Ok(BuiltRule::Validator(Box::new(HardwareCompatible { allowed })))
    }
    /// Only with a compatibility table: without one every type runs everywhere, and a validator
    /// reading the type would only split the index's request classes by type.
    fn by_default(context: &RuleContext) -> bool {
        !context.compatibility.is_empty()
    }
}
