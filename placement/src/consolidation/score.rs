//! How a chooser ranks the hosts it could empty.
//!
//! Every chooser ranks hosts the way the model-free baselines do, because that is what buys empty
//! hosts for the fewest migrations: fewest VMs first, then least used ([`fewest_vms`]), or least
//! used first ([`least_used`]). Where they differ is what they know of the VMs' futures.
//!
//! The lifetime-aware choosers ([`ChooserKind::reads_lifetimes`](super::ChooserKind)) read, for
//! each VM, the chances that it is still there `t` from now, `S(t)`, and **skip the hosts whose
//! migrations would likely be wasted** ([`WasteRule`]): the VMs move longest-expected-first (LARS),
//! `max_in_flight` at a time, each `migration_s` long, so the j-th starts about
//! `floor(j / in_flight) * migration_s` from now; its move is wasted if it is still there then but
//! gone within an hour of arriving, with chance `S(turn) - S(turn + migration_s + 1 h)`. A host any
//! of whose moves is wasted with at least `max_waste` chance is left alone: either it empties by
//! itself, or a VM about to exit would be moved for nothing. A VM already likely gone before its
//! turn costs nothing either way.
//!
//! (A first design scored hosts by the expected empty-host time gained per expected migration and
//! left VMs about to exit to leave by themselves, holding their host; on the validation windows it
//! chose hosts with many VMs the model expected to leave, held them out of service for hours and
//! lost to fewest-VMs-first: docs/evaluation.md, "Consolidation".)
//!
//! The `age` chooser reads a model-free distribution of the remaining lifetime from the age alone
//! ([`age_survival`]); `lifetime` the model's, capped by the age's (whichever expects the VM gone
//! sooner: the model, trained on request-time features, reads young VMs as staying, while half of
//! those under an hour old leave within the next hour and a half); `oracle` the truth.
//!
//! `lifetime` (and `age-batches`, its model-free part) also reads the VM's batch: a VM one of
//! whose batch-mates left within the hour counts as gone within the hour after its move, and
//! waits in its host's queue while its batch is leaving ([`super::batches`]), since those exits
//! come in bursts no request-time model can see.

use super::{ConsolidationConfig, WASTED_WITHIN_S};

/// Fewest VMs first, then least used (`used_share` in [0, 1]): higher is better.
pub fn fewest_vms(vms: usize, used_share: f64) -> f64 {
    -(vms as f64) - 0.999 * used_share.clamp(0.0, 1.0)
}

/// Least used first, then fewest VMs: higher is better.
pub fn least_used(vms: usize, used_share: f64) -> f64 {
    -used_share.clamp(0.0, 1.0) - 1e-9 * vms as f64
}

/// The scale of [`age_survival`]: a VM just started is as likely as not to be gone within it.
pub const AGE_SCALE_S: f64 = 600.0;

/// A remaining lifetime read from the age alone: the conditional survival of a Pareto lifetime of
/// shape 1, `P(T > a + t | T > a) = (a + s) / (a + s + t)` with `s` = [`AGE_SCALE_S`]. The median
/// remaining lifetime is the age (plus `s`): the older a VM, the longer it is expected to stay.
pub fn age_survival(age_s: f64, after_s: &[f64], out: &mut [f64]) {
    let a = age_s.max(0.0) + AGE_SCALE_S;
    for (o, &t) in out.iter_mut().zip(after_s) {
        *o = a / (a + t.max(0.0));
    }
}

/// When a lifetime-aware chooser leaves a host alone (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WasteRule {
    in_flight: usize,
    migration_s: f64,
    max_waste: f64,
}

/// What the rule makes of one host.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRisk {
    /// Expected migrations (the VMs still there at their turn).
    pub expected_migrations: f64,
    /// Expected wasted migrations.
    pub expected_wasted: f64,
    /// The largest chance that one of its moves is wasted.
    pub worst: f64,
}

impl WasteRule {
    /// The rule of `config` on a zone of `hosts` hosts (its in-flight limit depends on them).
    pub fn new(config: &ConsolidationConfig, hosts: usize) -> Self {
        WasteRule {
            in_flight: config.in_flight_limit(hosts).max(1),
            migration_s: config.migration_s,
            max_waste: config.max_waste,
        }
    }

    /// The times from now at which the VM `j`-th in line is read: its turn, and an hour after
    /// its move completes.
    pub fn times(&self, j: usize) -> [f64; 2] {
        let turn = (j / self.in_flight) as f64 * self.migration_s;
        [turn, turn + self.migration_s + WASTED_WITHIN_S]
    }

    /// The risk of a host whose VMs, in the order they would move, are alive at their
    /// [`WasteRule::times`] with these chances.
    pub fn risk(&self, alive: impl IntoIterator<Item = [f64; 2]>) -> HostRisk {
        let mut risk = HostRisk { expected_migrations: 0.0, expected_wasted: 0.0, worst: 0.0 };
        for [at_turn, after] in alive {
            let wasted = (at_turn - after).max(0.0);
            risk.expected_migrations += at_turn;
            risk.expected_wasted += wasted;
            risk.worst = risk.worst.max(wasted);
        }
        risk
    }

    /// Whether the host is worth emptying.
    pub fn allows(&self, risk: &HostRisk) -> bool {
        risk.worst < self.max_waste
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_free_ranks_order_by_vms_then_use_and_by_use_then_vms() {
        assert!(fewest_vms(1, 0.9) > fewest_vms(2, 0.1));
        assert!(fewest_vms(2, 0.1) > fewest_vms(2, 0.5));
        assert!(fewest_vms(1, 1.0) > fewest_vms(2, 0.0), "a full share never ties the next count");
        assert!(least_used(9, 0.1) > least_used(1, 0.2));
        assert!(least_used(1, 0.2) > least_used(2, 0.2));
    }

    #[test]
    fn a_move_is_wasted_when_the_vm_is_there_at_its_turn_and_gone_within_the_hour_after() {
        let rule = WasteRule::new(
            &ConsolidationConfig {
                max_in_flight: crate::consolidation::InFlightLimit::Fixed(2),
                migration_s: 1200.0,
                max_waste: 0.5,
                ..ConsolidationConfig::default()
            },
            100,
        );
        assert_eq!(rule.times(0), [0.0, 4800.0]);
        assert_eq!(rule.times(1), [0.0, 4800.0], "two in flight: the second starts at once too");
        assert_eq!(rule.times(2), [1200.0, 6000.0]);
        // Staying for sure: no waste. Gone before its turn: no migration, no waste.
        let safe = rule.risk([[1.0, 1.0], [0.0, 0.0]]);
        assert_eq!((safe.expected_migrations, safe.expected_wasted, safe.worst), (1.0, 0.0, 0.0));
        assert!(rule.allows(&safe));
        // There at its turn, gone within the hour after its move with chance 0.6: left alone.
        let risky = rule.risk([[1.0, 1.0], [0.9, 0.3]]);
        assert!((risky.worst - 0.6).abs() < 1e-12 && (risky.expected_wasted - 0.6).abs() < 1e-12);
        assert!(!rule.allows(&risky));
    }

    #[test]
    fn age_reads_older_vms_as_staying_longer() {
        let grid = [0.0, 3600.0];
        let (mut young, mut old) = ([0.0; 2], [0.0; 2]);
        age_survival(0.0, &grid, &mut young);
        age_survival(86_400.0, &grid, &mut old);
        assert_eq!((young[0], old[0]), (1.0, 1.0));
        assert!(old[1] > 0.9 && young[1] < 0.2, "{old:?} {young:?}");
        // The median remaining lifetime is the age plus the scale.
        let mut half = [0.0];
        age_survival(3000.0, &[3600.0], &mut half);
        assert!((half[0] - 0.5).abs() < 1e-12);
    }
}
