//! The live inventory: every host with its capacity, state and VMs, and every placed VM.
//!
//! All changes go through [`InventoryState::place`] and [`InventoryState::release`], which keep the
//! used resources of each host equal to the sum of its VMs' demands and refuse anything that would
//! over-commit a host in any dimension. Hosts are addressed by a dense [`HostIndex`] so that policies
//! can keep their own per-host structures in plain vectors. Totals that statistics need (allocated
//! resources, non-empty hosts) and each tenant's VMs per rack (for spread constraints) are kept up to
//! date by the same two calls, so reading them is O(1).
//!
//! Each placed VM's record ([`NewVm`]) is held once, behind an `Arc` that the VM map, the journal
//! and the repredictions share: no map keeps a copy of its id (issue 44, memory per running VM).

use domain::{
    ClusterId, HostId, HostState, InventorySpec, LifetimePrediction, RackId, RequestDetails, RequestFacts, Resources,
    TenantId, VmId, VmRequest,
};
use lifetime_model::RequestFeatures;
use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Dense index of a host in [`InventoryState::hosts`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostIndex(pub u32);

impl HostIndex {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

/// Dense index of a rack, in order of first appearance in the inventory.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RackIndex(pub u32);

/// One host as the allocator tracks it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRecord {
    pub id: HostId,
    pub rack: RackId,
    pub rack_index: RackIndex,
    pub cluster: ClusterId,
    pub hardware: String,
    pub capacity: Resources,
    pub used: Resources,
    pub state: HostState,
    /// The VMs on the host, in placement order (their records, shared with the inventory's VMs).
    pub vms: Vec<Arc<NewVm>>,
    /// VMs migrating here: their demand is reserved in `used` until the migration completes.
    pub incoming: Vec<Arc<NewVm>>,
}

impl HostRecord {
    /// Capacity not used by VMs (never negative: `used <= capacity` always holds).
    pub fn free(&self) -> Resources {
        self.capacity.checked_sub(&self.used).unwrap_or(Resources::ZERO)
    }

    /// No VM on it and none migrating to it.
    pub fn is_empty(&self) -> bool {
        self.vms.is_empty() && self.incoming.is_empty()
    }
}

/// One placed VM: where it is, and its record (shared with the journal's [`crate::Change::Placed`],
/// so that recording a placement copies nothing). Its fields read through to the record.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedVm {
    pub host: HostIndex,
    pub record: Arc<NewVm>,
}

impl std::ops::Deref for PlacedVm {
    type Target = NewVm;

    fn deref(&self) -> &NewVm {
        &self.record
    }
}

/// A [`PlacedVm`] in the set of placed VMs, found by its record's id: the set keeps no copy of the
/// id beside the record.
#[derive(Clone, Debug, PartialEq)]
struct ById(PlacedVm);

impl Eq for ById {}

impl Hash for ById {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the id hashes, so that a look-up by `&VmId` finds it (`Borrow`).
        self.0.record.id.hash(state);
    }
}

impl Borrow<VmId> for ById {
    fn borrow(&self) -> &VmId {
        &self.0.record.id
    }
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
    #[error("host `{0}` is not in the inventory")]
    UnknownHostId(HostId),
    #[error("VM `{0}` is already migrating")]
    AlreadyMigrating(VmId),
    #[error("VM `{0}` is not migrating")]
    NotMigrating(VmId),
    #[error("VM `{vm}` cannot migrate to its own host `{host}`")]
    SameHost { vm: VmId, host: HostId },
    #[error("host `{host}` is {state:?}, not available")]
    HostNotAvailable { host: HostId, state: HostState },
    #[error("VM `{vm}` ({demand}) does not fit on host `{host}` ({free} free)")]
    DoesNotFit { vm: VmId, host: HostId, demand: Resources, free: Resources },
    #[error("{0}")]
    HostPolicyState(String),
    #[error("host `{host}`: capacity {capacity} is below what its VMs use ({used})")]
    CapacityBelowUse { host: HostId, capacity: Resources, used: Resources },
    #[error("host `{host}` still has {vms} VMs (placed or arriving); release or move them first")]
    HostNotEmpty { host: HostId, vms: usize },
    #[error("host `{0}` was added, changed or removed: the allocator is rebuilt on the new inventory")]
    InventoryChanged(HostId),
}

/// Sums over the inventory, kept current by every change.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Totals {
    /// Sum of all hosts' capacity.
    pub capacity: Resources,
    /// Sum of all placed VMs' demand, and of the demand reserved for migrations on their targets.
    pub used: Resources,
    /// The part of `used` reserved on migrations' targets: a migrating VM uses both hosts, but it
    /// is one VM, counted by the occupancy figures on its source until its move completes.
    pub in_flight: Resources,
    /// Sum of the capacity of hosts with at least one VM.
    pub non_empty_capacity: Resources,
    pub non_empty_hosts: usize,
}

impl Totals {
    /// The placed VMs' demand, each VM once (a migrating one on its source).
    pub fn allocated(&self) -> Resources {
        self.used.checked_sub(&self.in_flight).unwrap_or(Resources::ZERO)
    }
}

/// The occupancy figures of the papers (SPEC section 7), from [`Totals`]: the one formula behind the
/// service's statistics and the simulator's metrics.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Occupancy {
    pub hosts: usize,
    pub empty_hosts: usize,
    pub allocated_cores: f64,
    pub capacity_cores: f64,
    pub allocated_memory_gib: f64,
    pub capacity_memory_gib: f64,
    /// Allocated cores over the cores of the non-empty hosts (0 when every host is empty).
    pub packing_density: f64,
    /// Empty hosts over all hosts, in percent.
    pub empty_hosts_pct: f64,
    /// Cores of the empty hosts over all free cores (0 when nothing is free).
    pub empty_to_free: f64,
}

impl Occupancy {
    fn of(totals: &Totals, hosts: usize) -> Occupancy {
        let cores = |r: &Resources| r.whole(domain::ResourceKind::Cores);
        // Nothing to divide by (nothing non-empty, nothing free, no host): 0.
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let empty_hosts = hosts.saturating_sub(totals.non_empty_hosts);
        // Space reserved for a migration is not free, but its VM is counted once, on its source.
        let free_cores = cores(&totals.capacity) - cores(&totals.used);
        let empty_cores = cores(&totals.capacity) - cores(&totals.non_empty_capacity);
        let allocated = totals.allocated();
        Occupancy {
            hosts,
            empty_hosts,
            allocated_cores: cores(&allocated),
            capacity_cores: cores(&totals.capacity),
            allocated_memory_gib: allocated.whole(domain::ResourceKind::MemoryGib),
            capacity_memory_gib: totals.capacity.whole(domain::ResourceKind::MemoryGib),
            packing_density: ratio(cores(&allocated), cores(&totals.non_empty_capacity)),
            empty_hosts_pct: 100.0 * ratio(empty_hosts as f64, hosts as f64),
            empty_to_free: ratio(empty_cores, free_cores),
        }
    }
}

/// Hosts and placed VMs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InventoryState {
    hosts: Vec<HostRecord>,
    by_id: HashMap<HostId, HostIndex>,
    racks: Vec<RackId>,
    rack_hosts: Vec<Vec<HostIndex>>,
    vms: HashSet<ById>,
    /// Migrations in flight: VM -> the host reserved for it.
    migrations: HashMap<VmId, HostIndex>,
    tenant_racks: HashMap<TenantId, HashMap<RackIndex, u32>>,
    totals: Totals,
}

/// A VM to put on a host: its id, its request's [`RequestFacts`], when it was placed and the
/// prediction it was placed with.
///
/// Serialised (a shared store's change log), in the form of earlier releases: the facts' columns
/// beside the id, the [`RequestDetails`] as `request`, left out when they are the defaults (and read
/// back as such when missing).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "NewVmWire", into = "NewVmWire")]
pub struct NewVm {
    pub id: VmId,
    pub facts: RequestFacts,
    /// When the allocator placed it, on its own clock.
    pub placed_at_s: f64,
    pub prediction: Option<LifetimePrediction>,
}

/// [`NewVm`] as the change log holds it.
#[derive(serde::Serialize, serde::Deserialize)]
struct NewVmWire {
    id: VmId,
    tenant: TenantId,
    vm_type: String,
    demand: Resources,
    placed_at_s: f64,
    prediction: Option<LifetimePrediction>,
    /// The request's time on the model's clock ([`RequestFacts::requested_at_s`]: trace time in a
    /// compressed replay, so not `placed_at_s`): a realized lifetime is its end minus this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requested_at_s: Option<f64>,
    #[serde(default, skip_serializing_if = "RequestDetails::is_default")]
    request: RequestDetails,
}

impl From<NewVmWire> for NewVm {
    fn from(wire: NewVmWire) -> Self {
        let NewVmWire { id, tenant, vm_type, demand, placed_at_s, prediction, requested_at_s, request } = wire;
        let facts = RequestFacts { tenant_id: tenant, vm_type, demand, requested_at_s, details: request };
        NewVm { id, facts, placed_at_s, prediction }
    }
}

impl From<NewVm> for NewVmWire {
    fn from(vm: NewVm) -> Self {
        let NewVm { id, facts, placed_at_s, prediction } = vm;
        let RequestFacts { tenant_id, vm_type, demand, requested_at_s, details } = facts;
        NewVmWire { id, tenant: tenant_id, vm_type, demand, placed_at_s, prediction, requested_at_s, request: details }
    }
}

impl NewVm {
    /// The VM that `request` asks for, placed at `placed_at_s` (its facts copied).
    pub fn of(request: &VmRequest, placed_at_s: f64) -> Self {
        NewVm {
            id: request.vm_id.clone(),
            facts: request.facts.clone(),
            placed_at_s,
            prediction: request.prediction.clone(),
        }
    }

    /// The VM's request as it was placed: its facts and prediction (not the tenant's spread limit
    /// or the zone, which the store does not keep).
    pub fn vm_request(&self) -> VmRequest {
        VmRequest { prediction: self.prediction.clone(), ..VmRequest::of(self.id.clone(), self.facts.clone()) }
    }

    /// What the lifetime model reads of the VM: its request's features, the request time standing
    /// in for by its placement time when it had none (as when it was placed).
    pub fn features(&self) -> RequestFeatures {
        RequestFeatures::of(&self.facts, self.placed_at_s)
    }
}

impl InventoryState {
    /// The inventory of `spec`, with no VM placed.
    pub fn from_spec(spec: &InventorySpec) -> Result<Self, StateError> {
        let mut state = InventoryState::default();
        let mut rack_indices: HashMap<RackId, RackIndex> = HashMap::new();
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
            let rack_index = *rack_indices.entry(host.rack.clone()).or_insert_with(|| {
                state.racks.push(host.rack.clone());
                state.rack_hosts.push(Vec::new());
                RackIndex(state.racks.len() as u32 - 1)
            });
            state.rack_hosts[rack_index.0 as usize].push(index);
            state.totals.capacity += host.capacity;
            state.hosts.push(HostRecord {
                id: host.host.clone(),
                rack: host.rack.clone(),
                rack_index,
                cluster: host.cluster.clone(),
                hardware: host.hardware.to_owned(),
                capacity: host.capacity,
                used: Resources::ZERO,
                state: host.state,
                vms: Vec::new(),
                incoming: Vec::new(),
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
        self.vms.get(id).map(|placed| &placed.0)
    }

    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// Every placed VM, in no particular order.
    pub fn vms(&self) -> impl Iterator<Item = (&VmId, &PlacedVm)> {
        self.vms.iter().map(|placed| (&placed.0.record.id, &placed.0))
    }

    pub fn racks(&self) -> &[RackId] {
        &self.racks
    }

    /// The hosts of a rack, in inventory order.
    pub fn rack_hosts(&self, rack: RackIndex) -> &[HostIndex] {
        self.rack_hosts.get(rack.0 as usize).map_or(&[], Vec::as_slice)
    }

    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    /// Packing density, empty hosts and empty-to-free now.
    pub fn occupancy(&self) -> Occupancy {
        Occupancy::of(&self.totals, self.hosts.len())
    }

    /// The tenant's VMs per rack (empty for a tenant with no VM).
    pub fn tenant_racks(&self, tenant: &TenantId) -> Option<&HashMap<RackIndex, u32>> {
        self.tenant_racks.get(tenant)
    }

    /// Places a VM on an available host with room for it; changes nothing on error.
    pub fn place(&mut self, vm: impl Into<Arc<NewVm>>, host: HostIndex) -> Result<(), StateError> {
        self.place_checked(vm.into(), host, true)
    }

    /// Puts back a VM that the durable store says is on `host`, whatever the host's state (a
    /// drained host keeps its VMs). Capacity is still checked: a store that contradicts the
    /// inventory is an error, never an over-commit.
    pub fn restore(&mut self, vm: impl Into<Arc<NewVm>>, host: HostIndex) -> Result<(), StateError> {
        self.place_checked(vm.into(), host, false)
    }

    fn place_checked(&mut self, vm: Arc<NewVm>, host: HostIndex, require_available: bool) -> Result<(), StateError> {
        if self.vms.contains(&vm.id) {
            return Err(StateError::AlreadyPlaced(vm.id.clone()));
        }
        self.check_room(host, &vm.id, &vm.facts.demand, require_available)?;
        self.book(host, &vm, false);
        self.vms.insert(ById(PlacedVm { host, record: vm }));
        Ok(())
    }

    /// Whether `host` exists and has room for `demand` of `vm`, whatever its state (what a VM that
    /// a cloud reports on it needs).
    pub fn check_fits(&self, host: HostIndex, vm: &VmId, demand: &Resources) -> Result<(), StateError> {
        self.check_room(host, vm, demand, false)
    }

    /// Whether `host` exists, is available (when required) and has room for `demand` of `vm`.
    fn check_room(
        &self,
        host: HostIndex,
        vm: &VmId,
        demand: &Resources,
        require_available: bool,
    ) -> Result<(), StateError> {
        let record = self.hosts.get(host.get()).ok_or(StateError::UnknownHost(host.0))?;
        if require_available && record.state != HostState::Available {
            return Err(StateError::HostNotAvailable { host: record.id.clone(), state: record.state });
        }
        match record.used.checked_add(demand) {
            Some(used) if used.fits_within(&record.capacity) => Ok(()),
            _ => Err(StateError::DoesNotFit {
                vm: vm.clone(),
                host: record.id.clone(),
                demand: *demand,
                free: record.free(),
            }),
        }
    }

    /// Puts `demand` of `vm` on `host` (among its VMs, or its incoming reservations), after
    /// [`InventoryState::check_room`]; the mirror of [`InventoryState::unbook`].
    fn book(&mut self, host: HostIndex, vm: &Arc<NewVm>, incoming: bool) {
        let (tenant, demand) = (&vm.facts.tenant_id, &vm.facts.demand);
        let record = &mut self.hosts[host.get()];
        if record.is_empty() {
            self.totals.non_empty_hosts += 1;
            self.totals.non_empty_capacity += record.capacity;
        }
        self.totals.used += *demand;
        record.used += *demand;
        if incoming {
            self.totals.in_flight += *demand;
            record.incoming.push(Arc::clone(vm));
        } else {
            record.vms.push(Arc::clone(vm));
        }
        // The tenant's id is copied only for its first VM.
        let racks = match self.tenant_racks.get_mut(tenant) {
            Some(racks) => racks,
            None => self.tenant_racks.entry(tenant.clone()).or_default(),
        };
        *racks.entry(record.rack_index).or_insert(0) += 1;
    }

    /// Removes a VM and gives its resources back to its host (and to the host reserved for it, if
    /// it was migrating).
    pub fn release(&mut self, vm: &VmId) -> Result<PlacedVm, StateError> {
        if self.migrations.contains_key(vm) {
            self.cancel_migration(vm)?;
        }
        let ById(placed) = self.vms.take(vm).ok_or_else(|| StateError::UnknownVm(vm.clone()))?;
        self.unbook(placed.host, &placed.record, false);
        Ok(placed)
    }

    /// Takes `demand` of `vm` off `host` (from its VMs, or from its incoming reservations).
    fn unbook(&mut self, host: HostIndex, vm: &NewVm, incoming: bool) {
        let (tenant, demand) = (&vm.facts.tenant_id, &vm.facts.demand);
        let record = &mut self.hosts[host.get()];
        // `used` is the sum of the VMs' and reservations' demands, so none of these can underflow.
        record.used = record.used.checked_sub(demand).unwrap_or(Resources::ZERO);
        self.totals.used = self.totals.used.checked_sub(demand).unwrap_or(Resources::ZERO);
        if incoming {
            self.totals.in_flight = self.totals.in_flight.checked_sub(demand).unwrap_or(Resources::ZERO);
        }
        let list = if incoming { &mut record.incoming } else { &mut record.vms };
        if let Some(at) = list.iter().position(|v| v.id == vm.id) {
            list.remove(at);
        }
        if record.is_empty() {
            self.totals.non_empty_hosts -= 1;
            self.totals.non_empty_capacity =
                self.totals.non_empty_capacity.checked_sub(&record.capacity).unwrap_or(Resources::ZERO);
        }
        let rack = record.rack_index;
        if let Some(racks) = self.tenant_racks.get_mut(tenant) {
            if let Some(count) = racks.get_mut(&rack) {
                *count -= 1;
                if *count == 0 {
                    racks.remove(&rack);
                }
            }
            if racks.is_empty() {
                self.tenant_racks.remove(tenant);
            }
        }
    }

    /// The host reserved for a VM that is migrating.
    pub fn migration_target(&self, vm: &VmId) -> Option<HostIndex> {
        self.migrations.get(vm).copied()
    }

    /// Migrations in flight: VM -> target host.
    pub fn migrations(&self) -> impl Iterator<Item = (&VmId, HostIndex)> {
        self.migrations.iter().map(|(vm, host)| (vm, *host))
    }

    /// Starts migrating a placed VM to `target`: reserves its demand there while it still occupies
    /// its source (a live migration uses both hosts). `require_available` is off only to restore a
    /// reservation from the store. Changes nothing on error.
    pub fn reserve(&mut self, vm: &VmId, target: HostIndex, require_available: bool) -> Result<(), StateError> {
        let placed = self.vm(vm).ok_or_else(|| StateError::UnknownVm(vm.clone()))?;
        if self.migrations.contains_key(vm) {
            return Err(StateError::AlreadyMigrating(vm.clone()));
        }
        if placed.host == target {
            return Err(StateError::SameHost { vm: vm.clone(), host: self.hosts[target.get()].id.clone() });
        }
        let record = Arc::clone(&placed.record);
        self.check_room(target, vm, &record.facts.demand, require_available)?;
        self.book(target, &record, true);
        self.migrations.insert(vm.clone(), target);
        Ok(())
    }

    /// Completes a migration: the VM leaves its source and occupies the reserved host. Returns the
    /// source.
    pub fn complete_migration(&mut self, vm: &VmId) -> Result<HostIndex, StateError> {
        let target = self.migrations.remove(vm).ok_or_else(|| StateError::NotMigrating(vm.clone()))?;
        let placed = self.vm(vm).ok_or_else(|| StateError::UnknownVm(vm.clone()))?;
        let (source, moved) = (placed.host, Arc::clone(&placed.record));
        self.unbook(source, &moved, false);
        // The demand was booked on the target with the reservation; the VM now counts there.
        self.totals.in_flight = self.totals.in_flight.checked_sub(&moved.facts.demand).unwrap_or(Resources::ZERO);
        let record = &mut self.hosts[target.get()];
        if let Some(at) = record.incoming.iter().position(|v| v.id == *vm) {
            record.incoming.remove(at);
        }
        record.vms.push(moved);
        if let Some(ById(mut placed)) = self.vms.take(vm) {
            placed.host = target;
            self.vms.insert(ById(placed));
        }
        Ok(source)
    }

    /// Abandons a migration: the reservation on the target is given back. Returns the target.
    pub fn cancel_migration(&mut self, vm: &VmId) -> Result<HostIndex, StateError> {
        let target = self.migrations.remove(vm).ok_or_else(|| StateError::NotMigrating(vm.clone()))?;
        let placed = self.vm(vm).ok_or_else(|| StateError::UnknownVm(vm.clone()))?;
        let record = Arc::clone(&placed.record);
        self.unbook(target, &record, true);
        Ok(target)
    }

    /// Changes a host's capacity (a cloud resized it), never below what it uses.
    pub fn set_capacity(&mut self, host: HostIndex, capacity: Resources) -> Result<(), StateError> {
        let record = self.hosts.get_mut(host.get()).ok_or(StateError::UnknownHost(host.0))?;
        if !record.used.fits_within(&capacity) {
            return Err(StateError::CapacityBelowUse { host: record.id.clone(), capacity, used: record.used });
        }
        let old = std::mem::replace(&mut record.capacity, capacity);
        let non_empty = !record.is_empty();
        for (total, counted) in [(&mut self.totals.capacity, true), (&mut self.totals.non_empty_capacity, non_empty)] {
            if counted {
                *total = total.checked_sub(&old).unwrap_or(Resources::ZERO) + capacity;
            }
        }
        Ok(())
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

    fn vm(id: &str, demand: Resources) -> NewVm {
        let tenant = format!("t-{}", id.len() % 3);
        NewVm {
            id: VmId::from(id),
            facts: RequestFacts::new(&tenant, "test", demand),
            placed_at_s: 0.0,
            prediction: None,
        }
    }

    #[test]
    fn place_and_release_keep_used_resources_exact() {
        let mut state = inventory(2);
        let h = HostIndex(0);
        state.place(vm("a", demand(4.0, 8.0)), h).unwrap();
        state.place(vm("b", demand(12.0, 8.0)), h).unwrap();
        assert_eq!(state.host(h).unwrap().free(), demand(0.0, 48.0));
        let err = state.place(vm("c", demand(1.0, 1.0)), h).unwrap_err();
        assert!(matches!(err, StateError::DoesNotFit { .. }));
        assert_eq!(
            state.place(vm("a", demand(1.0, 1.0)), HostIndex(1)),
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
        state.place(vm("a", demand(1.0, 1.0)), h).unwrap();
        state.set_host_state(h, HostState::Unavailable).unwrap();
        assert!(matches!(state.place(vm("b", demand(1.0, 1.0)), h), Err(StateError::HostNotAvailable { .. })));
        assert_eq!(state.host(h).unwrap().vms.iter().map(|vm| vm.id.as_str()).collect::<Vec<_>>(), ["a"]);
        assert!(state.restore(vm("b", demand(1.0, 1.0)), h).is_ok(), "recovery puts VMs back on drained hosts");
        assert!(state.release(&VmId::from("a")).is_ok());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Place { vm: u8, host: u8, cores: u8, memory: u8 },
        Release { vm: u8 },
        SetState { host: u8, available: bool },
        Migrate { vm: u8, host: u8 },
        Complete { vm: u8 },
        Cancel { vm: u8 },
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
            (0u8..40, 0u8..5).prop_map(|(vm, host)| Op::Migrate { vm, host }),
            (0u8..40).prop_map(|vm| Op::Complete { vm }),
            (0u8..40).prop_map(|vm| Op::Cancel { vm }),
        ]
    }

    proptest! {
        /// Whatever the sequence of operations (migrations started, completed and cancelled among
        /// them): no host is ever over-committed in any dimension, each host's used resources equal
        /// the sum of its VMs' and reservations' demands, each VM is counted once by the occupancy
        /// figures, and a failed operation changes nothing.
        #[test]
        fn never_over_commits_and_books_stay_exact(ops in proptest::collection::vec(op(), 1..200)) {
            let mut state = inventory(5);
            for op in ops {
                let before = state.clone();
                let result = match op {
                    Op::Place { vm: id, host, cores, memory } => state.place(
                        vm(&format!("v{id}"), demand(f64::from(cores), f64::from(memory))),
                        HostIndex(u32::from(host))),
                    Op::Release { vm } => state.release(&VmId(format!("v{vm}"))).map(|_| ()),
                    Op::SetState { host, available } => state.set_host_state(
                        HostIndex(u32::from(host)),
                        if available { HostState::Available } else { HostState::Unavailable }),
                    Op::Migrate { vm, host } => state.reserve(&VmId(format!("v{vm}")), HostIndex(u32::from(host)), true),
                    Op::Complete { vm } => state.complete_migration(&VmId(format!("v{vm}"))).map(|_| ()),
                    Op::Cancel { vm } => state.cancel_migration(&VmId(format!("v{vm}"))).map(|_| ()),
                };
                if result.is_err() {
                    prop_assert_eq!(&state, &before);
                }
                for (i, host) in state.hosts().iter().enumerate() {
                    prop_assert!(host.used.fits_within(&host.capacity));
                    let sum = host.vms.iter().fold(Resources::ZERO, |acc, vm| {
                        let placed = state.vm(&vm.id).expect("listed VMs are placed");
                        assert_eq!(placed.host, HostIndex(i as u32));
                        acc + placed.facts.demand
                    });
                    let reserved = host.incoming.iter().fold(Resources::ZERO, |acc, vm| {
                        assert_eq!(state.migration_target(&vm.id), Some(HostIndex(i as u32)));
                        acc + vm.facts.demand
                    });
                    prop_assert_eq!(sum + reserved, host.used);
                }
                let placed = state.vms().fold(Resources::ZERO, |acc, (_, vm)| acc + vm.record.facts.demand);
                prop_assert_eq!(state.totals().allocated(), placed);
                prop_assert_eq!(state.occupancy().allocated_cores, placed.whole(domain::ResourceKind::Cores));
                prop_assert_eq!(state.hosts().iter().map(|h| h.vms.len()).sum::<usize>(), state.vm_count());
                // The running totals equal a recount.
                let non_empty: Vec<_> = state.hosts().iter().filter(|h| !h.is_empty()).collect();
                prop_assert_eq!(state.totals().non_empty_hosts, non_empty.len());
                prop_assert_eq!(state.totals().non_empty_capacity,
                    non_empty.iter().fold(Resources::ZERO, |acc, h| acc + h.capacity));
                prop_assert_eq!(state.totals().used, state.hosts().iter().fold(Resources::ZERO, |acc, h| acc + h.used));
                // A migrating VM counts on its target's rack too (its reservation is there).
                let tenant_vms = (state.vm_count() + state.migrations().count()) as u32;
                let counted: u32 = ["t-0", "t-1", "t-2"].iter()
                    .filter_map(|t| state.tenant_racks(&TenantId::from(*t)))
                    .flat_map(|racks| racks.values()).sum();
                prop_assert_eq!(tenant_vms, counted);
            }
        }
    }
}
