//! Occupancy and lifetime figures of the inventory (`GET /v1/stats`); the occupancy formulas are
//! [`crate::state::InventoryState::occupancy`], which the simulator's metrics share.

use super::Allocator;
use crate::host_state::HostStateStats;
use crate::select::IncrementalIndex;
use domain::{HostState, LifetimeClass, ResourceKind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Occupancy and lifetime figures of the inventory (`GET /v1/stats`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocatorStats {
    pub policy: String,
    pub hosts: usize,
    pub available_hosts: usize,
    pub empty_hosts: usize,
    pub vms: usize,
    /// Allocated cores / cores of non-empty hosts.
    pub packing_density: f64,
    /// Share of hosts with no VM, in percent.
    pub empty_hosts_pct: f64,
    /// Free cores on empty hosts / all free cores (paper 002 s D).
    pub empty_to_free_ratio: f64,
    pub allocated_cores: f64,
    pub capacity_cores: f64,
    pub allocated_memory_gib: f64,
    pub capacity_memory_gib: f64,
    pub vms_short: usize,
    pub vms_long: usize,
    pub cores_short: f64,
    pub cores_long: f64,
    /// Requests rejected since start, by reason.
    pub rejections: HashMap<String, u64>,
    /// Cached request classes of the incremental index.
    pub classes_cached: usize,
    /// Hosts by policy state and class (stateful policies such as LAVA only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_states: Option<HostStateStats>,
    /// Version of the remaining-lifetime model repredicting exit times, if one is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reprediction_model: Option<String>,
    /// Model evaluations made by repredictions since start (a reprediction answered from the VM's
    /// last evaluation, its uptime still where the model's answer cannot have changed, is not one).
    pub repredictions: u64,
}

impl Allocator {
    /// Occupancy and lifetime figures; O(VMs) for the by-class counts.
    pub fn stats(&self) -> AllocatorStats {
        let occupancy = self.state.occupancy();
        let hosts = self.state.hosts();
        let cores = |r: &domain::Resources| r.whole(ResourceKind::Cores);
        let (mut vms_long, mut cores_long) = (0, 0.0);
        for (_, vm) in self.state.vms() {
            if domain::prediction::placement_class(vm.prediction.as_ref()) == LifetimeClass::Long {
                vms_long += 1;
                cores_long += cores(&vm.facts.demand);
            }
        }
        AllocatorStats {
            policy: self.policy.name().to_owned(),
            hosts: occupancy.hosts,
            available_hosts: hosts.iter().filter(|h| h.state == HostState::Available).count(),
            empty_hosts: occupancy.empty_hosts,
            vms: self.state.vm_count(),
            packing_density: occupancy.packing_density,
            empty_hosts_pct: occupancy.empty_hosts_pct,
            empty_to_free_ratio: occupancy.empty_to_free,
            allocated_cores: occupancy.allocated_cores,
            capacity_cores: occupancy.capacity_cores,
            allocated_memory_gib: occupancy.allocated_memory_gib,
            capacity_memory_gib: occupancy.capacity_memory_gib,
            vms_short: self.state.vm_count() - vms_long,
            vms_long,
            cores_short: occupancy.allocated_cores - cores_long,
            cores_long,
            rejections: self
                .rejections
                .iter()
                .map(|(code, n)| {
                    (
                        serde_json::to_value(code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
                        *n,
                    )
                })
                .collect(),
            classes_cached: self.index.as_ref().map_or(0, IncrementalIndex::classes_cached),
            host_states: self.host_state.as_ref().map(|state| state.stats()),
            reprediction_model: self.repredictions.model_version().map(str::to_owned),
            repredictions: self.repredictions.count,
        }
    }

    /// Bytes held by the incremental index.
    pub fn index_heap_bytes(&self) -> usize {
        self.index.as_ref().map_or(0, IncrementalIndex::heap_bytes)
    }
}
