//! LAVA's per-host state machine (paper 000 s4.3, paper 002 Alg. 3).
//!
//! Every host is `empty`, `open` or `recycling`, with a lifetime class (< 1 h, 1-10 h, 10-100 h,
//! 100-1000 h, >= 1000 h) and a deadline:
//!
//! - an empty host that receives a VM opens with the VM's class, its deadline 1.1x the class's
//!   upper bound away;
//! - an open host with more than 90% of its cores or memory used starts recycling, and the VMs on
//!   it become its *residual* VMs;
//! - when the last residual VM exits, the class drops by one and the VMs still there become the new
//!   residual VMs (overpredicted lifetimes);
//! - a host still not empty at its deadline moves one class up, and its VMs become residual
//!   (underpredicted lifetimes);
//! - a host that empties is empty again.
//!
//! The state changes only at those events, so the preference rule that reads it
//! ([`LavaPreference`]) stays exact in the cached index. All of LAVA lives here, behind the
//! allocator's one extension point for per-host policy state ([`crate::host_state`]): [`Lava`]
//! keeps every host's [`LavaHost`] and answers the hooks (place, release, migration, the deadline
//! as the host's timer), its code is what [`LavaPreference`] ranks, and its snapshot is what the
//! store keeps. Deadline transitions take the deadline itself as their time, so replaying them after
//! a restart gives the very same state.

use crate::host_state::{HostStateError, HostStateKind, HostStatePolicy, HostStateStats};
use crate::lifetime::{ClassIndex, LifetimeClasses};
use crate::rules::{
    BuiltRule, HostView, NoParams, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest,
};
use crate::state::{HostIndex, HostRecord};
use domain::{ResourceKind, VmId};
use serde::{Deserialize, Serialize};
use std::any::Any;

/// The name LAVA's rule asks for and its store rows carry.
pub const NAME: &str = "lava";

/// LAVA's class cut-offs: 1 h, 10 h, 100 h, 1000 h.
pub const CLASS_CUTOFFS_S: [f64; 4] = [3_600.0, 36_000.0, 360_000.0, 3_600_000.0];

/// An open host starts recycling above this share of its cores or memory.
pub const RECYCLE_AT: f64 = 0.9;

/// A host's deadline is this multiple of its class's upper bound after the class was set.
pub const DEADLINE_FACTOR: f64 = 1.1;

/// LAVA's lifetime classes.
pub fn classes() -> LifetimeClasses {
    match LifetimeClasses::new(CLASS_CUTOFFS_S.to_vec()) {
        Ok(classes) => classes,
        Err(error) => unreachable!("LAVA's cut-offs are valid: {error}"),
    }
}

/// The state of a host.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LavaState {
    #[default]
    Empty,
    Open,
    Recycling,
}

impl LavaState {
    pub fn name(self) -> &'static str {
        match self {
            LavaState::Empty => "empty",
            LavaState::Open => "open",
            LavaState::Recycling => "recycling",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [LavaState::Empty, LavaState::Open, LavaState::Recycling].into_iter().find(|s| s.name() == name)
    }
}

/// One host's full LAVA state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LavaHost {
    pub state: LavaState,
    /// Lifetime class (0: < 1 h ... 4: >= 1000 h); 0 while empty.
    pub class: ClassIndex,
    /// When the class moves up if the host is not empty by then; absent when empty or in the top
    /// class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_s: Option<f64>,
    /// The VMs whose exit makes the class drop, in placement order.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub residual_vms: Vec<VmId>,
}

impl LavaHost {
    /// What [`LavaPreference`] ranks: a recycling host of class `c` is `c`, an open one `OPEN + c`,
    /// any other `OTHER` (the rule itself ranks hosts with no VM as `EMPTY`).
    pub fn code(&self) -> u32 {
        match self.state {
            LavaState::Recycling => u32::from(self.class),
            LavaState::Open => LavaPreference::OPEN + u32::from(self.class),
            LavaState::Empty => LavaPreference::OTHER,
        }
    }

    /// The deadline of a class set at `now_s`: 1.1x the class's upper bound later; none for the top
    /// class, which has no bound.
    fn deadline(class: ClassIndex, now_s: f64) -> Option<f64> {
        CLASS_CUTOFFS_S.get(usize::from(class)).map(|bound| now_s + DEADLINE_FACTOR * bound)
    }

    fn top_class() -> ClassIndex {
        CLASS_CUTOFFS_S.len() as ClassIndex
    }

    fn set_class(&mut self, class: ClassIndex, host: &HostRecord, now_s: f64) {
        self.class = class;
        self.deadline_s = Self::deadline(class, now_s);
        self.residual_vms = host.vms.iter().map(|vm| vm.id.clone()).collect();
    }

    /// A VM of `vm_class` was placed on `host` (its record already includes the VM).
    pub fn on_place(&mut self, host: &HostRecord, vm_class: ClassIndex, now_s: f64) {
        if self.state == LavaState::Empty {
            self.state = LavaState::Open;
            self.class = vm_class.min(Self::top_class());
            self.deadline_s = Self::deadline(self.class, now_s);
            self.residual_vms.clear();
        }
        if self.state == LavaState::Open && over_recycling_threshold(host) {
            self.state = LavaState::Recycling;
            self.residual_vms = host.vms.iter().map(|vm| vm.id.clone()).collect();
        }
    }

    /// `vm` left `host` (its record no longer includes the VM).
    pub fn on_release(&mut self, host: &HostRecord, vm: &VmId, now_s: f64) {
        if host.vms.is_empty() {
            *self = LavaHost::default();
            return;
        }
        let Some(at) = self.residual_vms.iter().position(|v| v == vm) else { return };
        self.residual_vms.remove(at);
        if self.residual_vms.is_empty() {
            // Every VM of the host's class has gone: what is left is of the class below.
            self.set_class(self.class.saturating_sub(1), host, now_s);
        }
    }

    /// The deadline passed with VMs still on the host: one class up, the VMs there become residual.
    /// Returns whether anything changed.
    pub fn on_deadline(&mut self, host: &HostRecord, now_s: f64) -> bool {
        match self.deadline_s {
            Some(deadline) if deadline <= now_s && !host.vms.is_empty() => {
                self.set_class((self.class + 1).min(Self::top_class()), host, deadline);
                true
            }
            _ => false,
        }
    }
}

/// Every host's LAVA state: the [`HostStatePolicy`] the allocator keeps when a policy has
/// [`LavaPreference`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lava {
    hosts: Vec<LavaHost>,
}

impl Lava {
    pub fn boxed(hosts: usize) -> Box<dyn HostStatePolicy> {
        Box::new(Lava { hosts: vec![LavaHost::default(); hosts] })
    }

    pub fn host(&self, host: HostIndex) -> &LavaHost {
        &self.hosts[host.get()]
    }
}

impl HostStatePolicy for Lava {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_place(&mut self, host: HostIndex, record: &HostRecord, vm_class: ClassIndex, now_s: f64) {
        self.hosts[host.get()].on_place(record, vm_class, now_s);
    }

    fn on_release(&mut self, host: HostIndex, record: &HostRecord, vm: &VmId, now_s: f64) {
        self.hosts[host.get()].on_release(record, vm, now_s);
    }

    fn timer_s(&self, host: HostIndex) -> Option<f64> {
        self.hosts[host.get()].deadline_s
    }

    fn on_timer(&mut self, host: HostIndex, record: &HostRecord, at_s: f64) -> bool {
        self.hosts[host.get()].on_deadline(record, at_s)
    }

    fn code(&self, host: HostIndex) -> u32 {
        self.hosts[host.get()].code()
    }

    fn snapshot(&self, host: HostIndex) -> Option<String> {
        let lava = &self.hosts[host.get()];
        // A plain struct of numbers, strings and an enum: serialising it cannot fail.
        (lava.state != LavaState::Empty).then(|| serde_json::to_string(lava).unwrap_or_default())
    }

    fn restore(&mut self, host: HostIndex, snapshot: Option<&str>) -> Result<(), HostStateError> {
        let error = |detail: String| HostStateError { policy: NAME, host: host.0, detail };
        let slot = self.hosts.get_mut(host.get()).ok_or_else(|| error("no such host".to_owned()))?;
        *slot = match snapshot {
            Some(json) => serde_json::from_str(json).map_err(|e| error(format!("unreadable: {e}")))?,
            None => LavaHost::default(),
        };
        if slot.class > LavaHost::top_class() {
            return Err(error(format!("class {} out of range", slot.class)));
        }
        Ok(())
    }

    fn stats(&self) -> HostStateStats {
        let mut stats = HostStateStats { policy: NAME.to_owned(), ..HostStateStats::default() };
        for state in [LavaState::Empty, LavaState::Open, LavaState::Recycling] {
            stats.by_state.insert(state.name().to_owned(), 0);
        }
        for lava in &self.hosts {
            *stats.by_state.entry(lava.state.name().to_owned()).or_insert(0) += 1;
            if lava.state != LavaState::Empty {
                *stats.by_class.entry(lava.class.to_string()).or_insert(0) += 1;
            }
        }
        stats
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// LAVA's host preference (paper 000 s4.3): recycling hosts of a class above the VM's, the closest
/// first; then open hosts of the VM's class; then any other non-empty host; then empty hosts.
/// With `c` the top class: scores `0..c` for recycling hosts `1..=c` classes above, `c` for an open
/// host of the same class, `c + 1` for other non-empty hosts, `c + 2` for empty ones.
#[derive(Debug)]
pub struct LavaPreference {
    pub top_class: ClassIndex,
}

impl Default for LavaPreference {
    fn default() -> Self {
        LavaPreference { top_class: LavaHost::top_class() }
    }
}

impl LavaPreference {
    /// Host codes: a recycling host of class `c` is `c`, an open one `OPEN + c`, an empty host
    /// `EMPTY`, any other non-empty host `OTHER`.
    const OPEN: u32 = 1 << 8;
    const OTHER: u32 = 1 << 9;
    const EMPTY: u32 = 1 << 10;
}

impl RegisteredRule for LavaPreference {
    const NAME: &'static str = "lava";
    type Params = NoParams;
    /// LAVA reads VMs by its own five classes.
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Preference(Box::new(LavaPreference::default()), Some(classes())))
    }
}

impl PreferenceRule for LavaPreference {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::LifetimeClass]
    }
    fn host_state(&self) -> Option<HostStateKind> {
        Some(HostStateKind { name: NAME, create: Lava::boxed })
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        self.score_of_code(self.host_code(host), request)
    }
    fn is_host_coded(&self) -> bool {
        true
    }
    fn host_code(&self, host: &HostView) -> u32 {
        if host.record.is_empty() {
            Self::EMPTY
        } else {
            host.lifetime.state_code
        }
    }
    /// Recycling hosts of a class above the VM's, closest first; then open hosts of the VM's
    /// class; then any other non-empty host; then empty hosts.
    fn score_of_code(&self, code: u32, request: &RuleRequest) -> u32 {
        let top = u32::from(self.top_class);
        let vm_class = u32::from(request.lifetime_class.min(self.top_class));
        match code {
            Self::EMPTY => top + 2,
            class if class < Self::OPEN && class > vm_class => class - vm_class - 1,
            open if open == Self::OPEN + vm_class => top,
            _ => top + 1,
        }
    }
}

/// More than 90% of the host's cores or memory in use.
fn over_recycling_threshold(host: &HostRecord) -> bool {
    [ResourceKind::Cores, ResourceKind::MemoryGib].into_iter().any(|kind| {
        let capacity = host.capacity.base(kind);
        capacity > 0 && host.used.base(kind) as f64 > RECYCLE_AT * capacity as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{HostIndex, InventoryState, NewVm};
    use domain::{InventorySpec, RequestFacts, Resources};

    const HOUR: f64 = 3600.0;

    struct Host {
        state: InventoryState,
        lava: LavaHost,
    }

    impl Host {
        fn new() -> Self {
            let capacity = Resources::from_whole(10.0, 100.0, 0.0).unwrap();
            Host {
                state: InventoryState::from_spec(&InventorySpec::homogeneous("z", 1, 1, capacity)).unwrap(),
                lava: LavaHost::default(),
            }
        }

        fn record(&self) -> &HostRecord {
            &self.state.hosts()[0]
        }

        fn place(&mut self, id: &str, cores: f64, class: ClassIndex, now_s: f64) {
            let vm = NewVm {
                id: VmId::from(id),
                facts: RequestFacts {
                    tenant_id: "t".into(),
                    vm_type: "D".to_owned(),
                    demand: Resources::from_whole(cores, 1.0, 0.0).unwrap(),
                    requested_at_s: None,
                    details: Default::default(),
                },
                placed_at_s: now_s,
                prediction: None,
            };
            self.state.place(vm, HostIndex(0)).unwrap();
            let record = self.state.hosts()[0].clone();
            self.lava.on_place(&record, class, now_s);
        }

        fn release(&mut self, id: &str, now_s: f64) {
            self.state.release(&VmId::from(id)).unwrap();
            let record = self.state.hosts()[0].clone();
            self.lava.on_release(&record, &VmId::from(id), now_s);
        }

        fn residual(&self) -> Vec<&str> {
            self.lava.residual_vms.iter().map(VmId::as_str).collect()
        }
    }

    /// Paper 000 Fig. 5a: an empty host opens with its first VM's class and recycles once over 90%.
    #[test]
    fn fig5a_an_open_host_recycles_past_90_percent() {
        let mut host = Host::new();
        host.place("a", 4.0, 2, 0.0);
        assert_eq!((host.lava.state, host.lava.class), (LavaState::Open, 2));
        assert_eq!(host.lava.deadline_s, Some(1.1 * 100.0 * HOUR));
        host.place("b", 5.0, 2, 10.0);
        assert_eq!(host.lava.state, LavaState::Open, "90% is not over 90%");
        assert!(host.residual().is_empty());
        host.place("c", 0.5, 2, 20.0);
        assert_eq!((host.lava.state, host.lava.class), (LavaState::Recycling, 2));
        assert_eq!(host.residual(), ["a", "b", "c"]);
    }

    /// Fig. 5b: when the residual VMs have all exited, the class drops and the VMs left become
    /// residual; this repeats until the host is empty.
    #[test]
    fn fig5b_residual_vms_exit_and_the_class_drops() {
        let mut host = Host::new();
        host.place("long1", 5.0, 3, 0.0);
        host.place("long2", 4.5, 3, 0.0);
        assert_eq!(host.lava.state, LavaState::Recycling);
        // Recycling hosts take shorter VMs into the gaps.
        host.release("long1", 100.0);
        host.place("mid", 2.0, 2, 200.0);
        assert_eq!(host.lava.class, 3, "a residual VM is still there");
        host.release("long2", 300.0);
        assert_eq!((host.lava.state, host.lava.class), (LavaState::Recycling, 2));
        assert_eq!(host.residual(), ["mid"]);
        assert_eq!(host.lava.deadline_s, Some(300.0 + 1.1 * 100.0 * HOUR));
        host.place("short", 1.0, 0, 400.0);
        host.release("mid", 500.0);
        assert_eq!((host.lava.state, host.lava.class), (LavaState::Recycling, 1));
        assert_eq!(host.residual(), ["short"]);
        host.release("short", 600.0);
        assert_eq!(host.lava, LavaHost::default(), "an emptied host is empty again");
    }

    /// Fig. 5c: a host still occupied at its deadline moves one class up, from the deadline on.
    #[test]
    fn fig5c_the_deadline_passes_and_the_class_rises() {
        let mut host = Host::new();
        host.place("a", 2.0, 1, 0.0);
        let deadline = 1.1 * 10.0 * HOUR;
        assert_eq!(host.lava.deadline_s, Some(deadline));
        let record = host.record().clone();
        assert!(!host.lava.on_deadline(&record, deadline - 1.0), "not yet");
        assert!(host.lava.on_deadline(&record, deadline + 50.0));
        assert_eq!((host.lava.state, host.lava.class), (LavaState::Open, 2));
        assert_eq!(host.residual(), ["a"]);
        assert_eq!(host.lava.deadline_s, Some(deadline + 1.1 * 100.0 * HOUR), "counted from the deadline itself");
        // The top class has no deadline.
        for _ in 0..2 {
            let at = host.lava.deadline_s.unwrap();
            host.lava.on_deadline(&record, at);
        }
        assert_eq!(host.lava.class, 4);
        assert_eq!(host.lava.deadline_s, None);
    }

    #[test]
    fn states_round_trip_by_name() {
        for state in [LavaState::Empty, LavaState::Open, LavaState::Recycling] {
            assert_eq!(LavaState::parse(state.name()), Some(state));
        }
        assert_eq!(LavaState::parse("closed"), None);
        assert_eq!(classes().count(), 5);
        assert_eq!(classes().class_of(2.0 * HOUR), 1);
    }

    /// What the store keeps of a host is its snapshot: it restores to the very same state (deadlines
    /// to the bit), the initial state has no row, and a row LAVA cannot read is refused by name.
    #[test]
    fn snapshots_restore_exactly_and_bad_rows_are_refused() {
        let mut host = Host::new();
        host.place("a", 9.5, 2, 1_795_461_663.832_133_5);
        let mut lava = Lava { hosts: vec![host.lava.clone(), LavaHost::default()] };
        let snapshot = lava.snapshot(HostIndex(0)).expect("not in the initial state");
        assert_eq!(lava.snapshot(HostIndex(1)), None, "the initial state has no row");
        let mut restored = Lava { hosts: vec![LavaHost::default(); 2] };
        restored.restore(HostIndex(0), Some(&snapshot)).unwrap();
        assert_eq!(restored, lava);
        assert_eq!(restored.code(HostIndex(0)), u32::from(2u8), "a recycling host of class 2");
        let stats = restored.stats();
        assert_eq!((stats.by_state["recycling"], stats.by_state["empty"], stats.by_class["2"]), (1, 1, 1));
        let err = lava.restore(HostIndex(1), Some(r#"{"state":"closed"}"#)).unwrap_err().to_string();
        assert!(err.starts_with("lava state of host 1: unreadable"), "{err}");
        let err = lava.restore(HostIndex(1), Some(r#"{"state":"open","class":9}"#)).unwrap_err().to_string();
        assert!(err.contains("class 9 out of range"), "{err}");
    }
}
