//! Policy state kept per host: the one extension point for stateful policies (LAVA's empty / open /
//! recycling hosts with their class, residual VMs and deadline are the first).
//!
//! A preference rule that reads such state brings its kind ([`crate::rules::PreferenceRule::host_state`],
//! a [`HostStateKind`]); the allocator then keeps one [`HostStatePolicy`] of that kind and calls its hooks
//! on every placement, release, migration and timer. What the rule reads is the host's *code*
//! ([`HostStatePolicy::code`]), which the allocator keeps in the host's lifetime summary so that the
//! incremental index sees a host change exactly when its code does. The store keeps each host's
//! state as an opaque row ([`HostStatePolicy::snapshot`], JSON text) written in the same transaction
//! as the placements that changed it, and gives it back on recovery ([`HostStatePolicy::restore`]).
//! Nothing outside this module and the policy's own module knows what the state means.
//!
//! Adding a stateful policy: a module with a type implementing [`HostStatePolicy`] and its rule
//! (whose `host_state` returns the kind), and one registration line in [`crate::registry`] (or in an
//! embedder's own registry).

use crate::lifetime::ClassIndex;
use crate::state::{HostIndex, HostRecord};
use domain::VmId;
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Debug;

/// Makes a stateful policy's state for that many hosts, all in their initial state.
pub type Create = fn(usize) -> Box<dyn HostStatePolicy>;

/// A kind of per-host state, as the rule that reads it brings it
/// ([`crate::rules::PreferenceRule::host_state`]).
#[derive(Copy, Clone, Debug)]
pub struct HostStateKind {
    /// The name its store rows carry (`lava`).
    pub name: &'static str,
    pub create: Create,
}

/// Why a stored host state could not be put back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{policy} state of host {host}: {detail}")]
pub struct HostStateError {
    pub policy: &'static str,
    pub host: u32,
    pub detail: String,
}

/// How many hosts are in each state, and the non-empty ones by class (`GET /v1/stats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostStateStats {
    /// The stateful policy (`lava`).
    pub policy: String,
    /// Hosts per state name.
    pub by_state: BTreeMap<String, usize>,
    /// Hosts not in their initial state, per class index (`"0"`, `"1"`, ...).
    pub by_class: BTreeMap<String, usize>,
}

/// The per-host state of one stateful policy over every host of the inventory. Hooks are called
/// after the inventory changed (the host's record already shows the change).
pub trait HostStatePolicy: Debug + Send + Sync {
    /// The policy's name, as its rules ask for it and its store rows carry it.
    fn name(&self) -> &'static str;

    /// A VM of `vm_class` (under the policy's lifetime classes) was placed on the host.
    fn on_place(&mut self, host: HostIndex, record: &HostRecord, vm_class: ClassIndex, now_s: f64);

    /// `vm` left the host.
    fn on_release(&mut self, host: HostIndex, record: &HostRecord, vm: &VmId, now_s: f64);

    /// `vm` (of `vm_class`) finished migrating from `source` to `target`: by default a release on
    /// the source and a placement on the target.
    fn on_migrate(&mut self, vm: &VmId, vm_class: ClassIndex, source: Moved, target: Moved, now_s: f64) {
        self.on_release(source.host, source.record, vm, now_s);
        self.on_place(target.host, target.record, vm_class, now_s);
    }

    /// When the host's timer next fires ([`HostStatePolicy::on_timer`]), if it has one.
    fn timer_s(&self, host: HostIndex) -> Option<f64>;

    /// The host's timer fired at `at_s` (its own time, not the clock's, so that replaying it after a
    /// restart gives the same state); returns whether the state changed.
    fn on_timer(&mut self, host: HostIndex, record: &HostRecord, at_s: f64) -> bool;

    /// What the policy's rule reads of the host: equal codes rank equally.
    fn code(&self, host: HostIndex) -> u32;

    /// The host's state as the store keeps it (JSON); `None` in the initial state, which has no row.
    fn snapshot(&self, host: HostIndex) -> Option<String>;

    /// Puts back a state the store kept (`None`: the initial state).
    fn restore(&mut self, host: HostIndex, snapshot: Option<&str>) -> Result<(), HostStateError>;

    /// Hosts by state and class.
    fn stats(&self) -> HostStateStats;

    /// For tests and tools that know the concrete policy: `downcast_ref` to it.
    fn as_any(&self) -> &dyn Any;
}

/// One end of a migration, as [`HostStatePolicy::on_migrate`] sees it.
#[derive(Copy, Clone, Debug)]
pub struct Moved<'a> {
    pub host: HostIndex,
    pub record: &'a HostRecord,
}
