//! The live inventory: every host with its capacity, state and VMs, and every placed VM.
//!
//! All changes go through [`InventoryState::place`] and [`InventoryState::release`], which keep the
//! used resources of each host equal to the sum of its VMs' demands and refuse anything that would
//! over-commit a host in any dimension. Hosts are addressed by a dense [`HostIndex`] so that policies
//! can keep their own per-host structures in plain vectors.

use domain::{ClusterId, HostId, HostState, InventorySpec, LifetimePrediction, RackId, Resources, VmId};
use std::collections::HashMap;

/// Dense index of a host in [`InventoryState::hosts`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostIndex(pub u32);

impl HostIndex {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

/// One host as the allocator tracks it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRecord {
    pub id: HostId,
    pub rack: RackId,
    pub cluster: ClusterId,
    pub hardware: String,
    pub capacity: Resources,
    pub used: Resources,
    pub state: HostState,
    /// The VMs on the host, in placement order.
    pub vms: Vec<VmId>,
}

impl HostRecord {
    /// Capacity not used by VMs (never negative: `used <= capacity` always holds).
    pub fn free(&self) -> Resources {
        self.capacity.checked_sub(&self.used).unwrap_or(Resources::ZERO)
    }

    pub fn is_empty(&self) -> bool {
        self.vms.is_empty()
    }
}

/// One placed VM.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedVm {
    pub host: HostIndex,
    pub demand: Resources,
    /// When it was placed, in the allocator's clock (seconds).
    pub placed_at_s: f64,
    pub prediction: Option<LifetimePrediction>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    #[error("host `{0}` appears twice in the inventory")]
    DuplicateHost(HostId),
    #[error("host `{host}` has no capacity in some dimension: {capacity}")]
    EmptyCapacity { host: HostId, capacity: Resources },
    #[error("VM `{0}` is already placed")]
    AlreadyPlaced(VmId),
    #[error("VM `{0}` is not placed")]
    UnknownVm(VmId),
    #[error("host index {0} does not exist")]
    UnknownHost(u32),
    #[error("host `{host}` is {state:?}, not available")]
    HostNotAvailable { host: HostId, state: HostState },
    #[error("VM `{vm}` ({demand}) does not fit on host `{host}` ({free} free)")]
    DoesNotFit { vm: VmId, host: HostId, demand: Resources, free: Resources },
}

/// Hosts and placed VMs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InventoryState {
    hosts: Vec<HostRecord>,
    by_id: HashMap<HostId, HostIndex>,
    vms: HashMap<VmId, PlacedVm>,
}

impl InventoryState {
    /// The inventory of `spec`, with no VM placed.
    pub fn from_spec(spec: &InventorySpec) -> Result<Self, StateError> {
        let mut state = InventoryState::default();
        for host in spec.hosts() {
            if host.capacity.base(domain::ResourceKind::Cores) == 0
                || host.capacity.base(domain::ResourceKind::MemoryGib) == 0
            {
                return Err(StateError::EmptyCapacity { host: host.host.clone(), capacity: host.capacity });
            }
            let index = HostIndex(state.hosts.len() as u32);
            if state.by_id.insert(host.host.clone(), index).is_some() {
                return Err(StateError::DuplicateHost(host.host.clone()));
            }
            state.hosts.push(HostRecord {
                id: host.host.clone(),
                rack: host.rack.clone(),
                cluster: host.cluster.clone(),
                hardware: host.hardware.to_owned(),
                capacity: host.capacity,
                used: Resources::ZERO,
                state: host.state,
                vms: Vec::new(),
            });
        }
        Ok(state)
    }

    pub fn hosts(&self) -> &[HostRecord] {
        &self.hosts
    }

    pub fn host(&self, index: HostIndex) -> Option<&HostRecord> {
        self.hosts.get(index.get())
    }

    pub fn host_index(&self, id: &HostId) -> Option<HostIndex> {
        self.by_id.get(id).copied()
    }

    pub fn vm(&self, id: &VmId) -> Option<&PlacedVm> {
        self.vms.get(id)
    }

    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// Places a VM on an available host with room for it; changes nothing on error.
    pub fn place(
        &mut self,
        vm: VmId,
        host: HostIndex,
        demand: Resources,
        placed_at_s: f64,
        prediction: Option<LifetimePrediction>,
    ) -> Result<(), StateError> {
        if self.vms.contains_key(&vm) {
            return Err(StateError::AlreadyPlaced(vm));
        }
        let record = self.hosts.get_mut(host.get()).ok_or(StateError::UnknownHost(host.0))?;
        if record.state != HostState::Available {
            return Err(StateError::HostNotAvailable { host: record.id.clone(), state: record.state });
        }
        let used = match record.used.checked_add(&demand) {
            Some(used) if used.fits_within(&record.capacity) => used,
            _ => return Err(StateError::DoesNotFit { vm, host: record.id.clone(), demand, free: record.free() }),
        };
        record.used = used;
        record.vms.push(vm.clone());
        self.vms.insert(vm, PlacedVm { host, demand, placed_at_s, prediction });
        Ok(())
    }

    /// Removes a VM and gives its resources back to its host.
    pub fn release(&mut self, vm: &VmId) -> Result<PlacedVm, StateError> {
        let placed = self.vms.remove(vm).ok_or_else(|| StateError::UnknownVm(vm.clone()))?;
        let record = &mut self.hosts[placed.host.get()];
        // `used` is the sum of the VMs' demands, so this cannot underflow.
        record.used = record.used.checked_sub(&placed.demand).unwrap_or(Resources::ZERO);
        if let Some(at) = record.vms.iter().position(|v| v == vm) {
            record.vms.remove(at);
        }
        Ok(placed)
    }

    /// Changes a host's state (drain, fail, restore); its VMs stay where they are.
    pub fn set_host_state(&mut self, host: HostIndex, state: HostState) -> Result<(), StateError> {
        let record = self.hosts.get_mut(host.get()).ok_or(StateError::UnknownHost(host.0))?;
        record.state = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inventory(hosts: usize) -> InventoryState {
        let capacity = Resources::from_whole(16.0, 64.0, 0.0).unwrap();
        InventoryState::from_spec(&InventorySpec::homogeneous("z", hosts, 4, capacity)).unwrap()
    }

    fn demand(cores: f64, memory: f64) -> Resources {
        Resources::from_whole(cores, memory, 0.0).unwrap()
    }

    #[test]
    fn place_and_release_keep_used_resources_exact() {
        let mut state = inventory(2);
        let h = HostIndex(0);
        state.place(VmId::from("a"), h, demand(4.0, 8.0), 0.0, None).unwrap();
        state.place(VmId::from("b"), h, demand(12.0, 8.0), 1.0, None).unwrap();
        assert_eq!(state.host(h).unwrap().free(), demand(0.0, 48.0));
        let err = state.place(VmId::from("c"), h, demand(1.0, 1.0), 2.0, None).unwrap_err();
        assert!(matches!(err, StateError::DoesNotFit { .. }));
        assert_eq!(
            state.place(VmId::from("a"), HostIndex(1), demand(1.0, 1.0), 2.0, None),
            Err(StateError::AlreadyPlaced(VmId::from("a")))
        );
        state.release(&VmId::from("a")).unwrap();
        assert_eq!(state.host(h).unwrap().free(), demand(4.0, 56.0));
        assert_eq!(state.release(&VmId::from("a")), Err(StateError::UnknownVm(VmId::from("a"))));
    }

    #[test]
    fn unavailable_hosts_take_nothing_but_keep_their_vms() {
        let mut state = inventory(1);
        let h = HostIndex(0);
        state.place(VmId::from("a"), h, demand(1.0, 1.0), 0.0, None).unwrap();
        state.set_host_state(h, HostState::Unavailable).unwrap();
        assert!(matches!(
            state.place(VmId::from("b"), h, demand(1.0, 1.0), 0.0, None),
            Err(StateError::HostNotAvailable { .. })
        ));
        assert_eq!(state.host(h).unwrap().vms, [VmId::from("a")]);
        assert!(state.release(&VmId::from("a")).is_ok());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Place { vm: u8, host: u8, cores: u8, memory: u8 },
        Release { vm: u8 },
        SetState { host: u8, available: bool },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..40, 0u8..5, 1u8..12, 1u8..40).prop_map(|(vm, host, cores, memory)| Op::Place {
                vm,
                host,
                cores,
                memory
            }),
            (0u8..40).prop_map(|vm| Op::Release { vm }),
            (0u8..5, any::<bool>()).prop_map(|(host, available)| Op::SetState { host, available }),
        ]
    }

    proptest! {
        /// Whatever the sequence of operations: no host is ever over-committed in any dimension,
        /// each host's used resources equal the sum of its VMs' demands, and a failed operation
        /// changes nothing.
        #[test]
        fn never_over_commits_and_books_stay_exact(ops in proptest::collection::vec(op(), 1..200)) {
            let mut state = inventory(5);
            for op in ops {
                let before = state.clone();
                let result = match op {
                    Op::Place { vm, host, cores, memory } => state.place(
                        VmId(format!("v{vm}")), HostIndex(u32::from(host)),
                        demand(f64::from(cores), f64::from(memory)), 0.0, None),
                    Op::Release { vm } => state.release(&VmId(format!("v{vm}"))).map(|_| ()),
                    Op::SetState { host, available } => state.set_host_state(
                        HostIndex(u32::from(host)),
                        if available { HostState::Available } else { HostState::Unavailable }),
                };
                if result.is_err() {
                    prop_assert_eq!(&state, &before);
                }
                for (i, host) in state.hosts().iter().enumerate() {
                    prop_assert!(host.used.fits_within(&host.capacity));
                    let sum = host.vms.iter().fold(Resources::ZERO, |acc, vm| {
                        let placed = state.vm(vm).expect("listed VMs are placed");
                        assert_eq!(placed.host, HostIndex(i as u32));
                        acc + placed.demand
                    });
                    prop_assert_eq!(sum, host.used);
                }
                prop_assert_eq!(state.hosts().iter().map(|h| h.vms.len()).sum::<usize>(), state.vm_count());
            }
        }
    }
}
