//! A stateful placement policy of an operator's own, outside the `placement` crate: "two per host".
//! A host takes at most two VMs while other hosts have room; its state counts the VMs placed on
//! each host since it was last empty. The allocator keeps the state, calls its hooks, ranks hosts
//! by it, makes it durable in its store and rebuilds it on restart, with no change to the framework.
//!
//! [`register`] adds the rule and a preset of the same name to a registry; the programs in
//! `src/bin` are the shipped allocator service and `simulate` with that one line added to their
//! `main`.

use domain::VmId;
use placement::host_state::{HostStateError, HostStateKind, HostStatePolicy, HostStateStats};
use placement::lifetime::ClassIndex;
use placement::rules::{
    BuiltRule, HostView, NoParams, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest,
};
use placement::state::{HostIndex, HostRecord};
use placement::Registry;
use std::any::Any;

/// The rule's, the state's and the preset's name.
pub const NAME: &str = "two-per-host";

/// `registry` with the rule and the preset `two-per-host`: the rule, then (as a host-coded rule
/// needs one below it) the temporal cost of exit times, then best fit.
pub fn register(registry: Registry) -> Registry {
    registry.with_rule::<TwoPerHostRule>().with_preset(NAME, &[NAME, "temporal-cost", "best-fit"])
}

/// The state: VMs placed on each host since it was last empty.
#[derive(Debug)]
pub struct TwoPerHost {
    placed: Vec<u32>,
}

impl TwoPerHost {
    fn boxed(hosts: usize) -> Box<dyn HostStatePolicy> {
        Box::new(TwoPerHost { placed: vec![0; hosts] })
    }
}

impl HostStatePolicy for TwoPerHost {
    fn name(&self) -> &'static str {
        NAME
    }
    fn on_place(&mut self, host: HostIndex, _: &HostRecord, _: ClassIndex, _: f64) {
        self.placed[host.get()] += 1;
    }
    fn on_release(&mut self, host: HostIndex, record: &HostRecord, _: &VmId, _: f64) {
        if record.is_empty() {
            self.placed[host.get()] = 0;
        }
    }
    fn timer_s(&self, _: HostIndex) -> Option<f64> {
        None
    }
    fn on_timer(&mut self, _: HostIndex, _: &HostRecord, _: f64) -> bool {
        false
    }
    /// 0 below two VMs, 2 at two or more (an empty host's code is the rule's, 1).
    fn code(&self, host: HostIndex) -> u32 {
        if self.placed[host.get()] >= 2 {
            2
        } else {
            0
        }
    }
    /// What the store keeps of a host: its count, none at zero.
    fn snapshot(&self, host: HostIndex) -> Option<String> {
        let placed = self.placed[host.get()];
        (placed > 0).then(|| placed.to_string())
    }
    fn restore(&mut self, host: HostIndex, snapshot: Option<&str>) -> Result<(), HostStateError> {
        let error = |detail: String| HostStateError { policy: NAME, host: host.get() as u32, detail };
        self.placed[host.get()] = match snapshot {
            Some(text) => text.parse().map_err(|e| error(format!("unreadable: {e}")))?,
            None => 0,
        };
        Ok(())
    }
    fn stats(&self) -> HostStateStats {
        let full = self.placed.iter().filter(|&&n| n >= 2).count();
        HostStateStats {
            policy: NAME.to_owned(),
            by_state: [("full".to_owned(), full), ("open".to_owned(), self.placed.len() - full)].into(),
            by_class: Default::default(),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The rule: hosts below two VMs first, then empty hosts, then hosts with two or more.
#[derive(Debug)]
pub struct TwoPerHostRule;

impl RegisteredRule for TwoPerHostRule {
    const NAME: &'static str = NAME;
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Preference(Box::new(TwoPerHostRule), None))
    }
}

impl PreferenceRule for TwoPerHostRule {
    fn name(&self) -> &'static str {
        NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[]
    }
    fn host_state(&self) -> Option<HostStateKind> {
        Some(HostStateKind { name: NAME, create: TwoPerHost::boxed })
    }
    fn is_host_coded(&self) -> bool {
        true
    }
    fn host_code(&self, host: &HostView) -> u32 {
        if host.record.is_empty() {
            1
        } else {
            host.lifetime.state_code
        }
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        self.score_of_code(self.host_code(host), request)
    }
}
