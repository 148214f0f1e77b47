//! Batches that are leaving: a tenant's VMs placed within a minute of each other tend to leave
//! together, so a VM one of whose batch-mates left within the last hour is likely to leave soon
//! too, and moving it would likely be wasted.
//!
//! On the Azure V1 development trace (VMs alive at random times in its second half), a VM older
//! than an hour left within the next 100 minutes with chance 0.15-0.17 when none of its batch had
//! left, 0.56-0.71 when one had left within the hour (0.14 against 0.07 past a day): the exits the
//! request-time model cannot order (docs/evaluation.md, "Consolidation under a migration budget").
//!
//! Only the exits seen since the allocator started are known (the record is not kept in the store;
//! after a restart the rule warms up within the hour).

use domain::TenantId;
use std::collections::{HashMap, VecDeque};

/// VMs of one tenant placed within this of each other are of one batch.
pub const BATCH_GAP_S: f64 = 60.0;

/// A batch whose VM left within this is leaving.
pub const LEAVING_WITHIN_S: f64 = 3600.0;

/// The exits of the last [`LEAVING_WITHIN_S`]: for each, its tenant and when it was placed.
#[derive(Clone, Debug, Default)]
pub struct RecentExits {
    by_tenant: HashMap<TenantId, VecDeque<Exit>>,
    order: VecDeque<(f64, TenantId)>,
}

#[derive(Clone, Copy, Debug)]
struct Exit {
    placed_at_s: f64,
    left_at_s: f64,
}

impl RecentExits {
    /// A VM of `tenant` placed at `placed_at_s` left at `now_s` (calls in clock order).
    pub fn record(&mut self, tenant: &TenantId, placed_at_s: f64, now_s: f64) {
        self.forget(now_s);
        let exit = Exit { placed_at_s, left_at_s: now_s };
        self.by_tenant.entry(tenant.clone()).or_default().push_back(exit);
        self.order.push_back((now_s, tenant.clone()));
    }

    /// Whether a VM of `tenant` placed at `placed_at_s` has a batch-mate that left within
    /// [`LEAVING_WITHIN_S`] before `now_s`.
    pub fn batch_leaving(&self, tenant: &TenantId, placed_at_s: f64, now_s: f64) -> bool {
        self.by_tenant.get(tenant).is_some_and(|exits| {
            exits
                .iter()
                .any(|e| now_s - e.left_at_s <= LEAVING_WITHIN_S && (e.placed_at_s - placed_at_s).abs() <= BATCH_GAP_S)
        })
    }

    /// [`RecentExits::batch_leaving`] for a placed VM.
    pub fn vm_leaving(&self, vm: &crate::state::NewVm, now_s: f64) -> bool {
        self.batch_leaving(&vm.facts.tenant_id, vm.placed_at_s, now_s)
    }

    /// Exits recorded (within the last hour of the latest).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Drops the exits older than [`LEAVING_WITHIN_S`].
    fn forget(&mut self, now_s: f64) {
        while let Some((left_at_s, tenant)) = self.order.front() {
            if now_s - left_at_s <= LEAVING_WITHIN_S {
                break;
            }
            if let Some(exits) = self.by_tenant.get_mut(tenant) {
                exits.pop_front();
                if exits.is_empty() {
                    self.by_tenant.remove(tenant);
                }
            }
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_leaving_for_an_hour_after_a_batch_mate_left() {
        let (a, b) = (TenantId::from("a"), TenantId::from("b"));
        let mut exits = RecentExits::default();
        exits.record(&a, 1000.0, 5000.0);
        assert!(exits.batch_leaving(&a, 1030.0, 5000.0), "placed 30 s apart: one batch");
        assert!(exits.batch_leaving(&a, 970.0, 8600.0), "an hour after the exit still");
        assert!(!exits.batch_leaving(&a, 1030.0, 8601.0), "past the hour");
        assert!(!exits.batch_leaving(&a, 1100.0, 5000.0), "placed 100 s apart: another batch");
        assert!(!exits.batch_leaving(&b, 1000.0, 5000.0), "another tenant");
        exits.record(&b, 0.0, 9000.0);
        assert_eq!(exits.len(), 1, "the first exit is forgotten past the hour");
        assert!(!exits.batch_leaving(&a, 1000.0, 9000.0));
    }
}
