//! `fits-resources`: the demand fits the host's free capacity in every dimension. A default
//! validator.

use super::{BuiltRule, HostView, NoParams, RegisteredRule, RequestTrait, RuleContext, RuleRequest, ValidatorRule};

/// The demand fits the host's free capacity in every dimension.
#[derive(Debug)]
pub struct FitsResources;

impl ValidatorRule for FitsResources {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Demand]
    }
    fn is_valid(&self, host: &HostView, request: &RuleRequest) -> bool {
        request.demand.fits_within(&host.record.free())
    }
}

impl RegisteredRule for FitsResources {
    const NAME: &'static str = "fits-resources";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Validator(Box::new(FitsResources)))
    }
}
