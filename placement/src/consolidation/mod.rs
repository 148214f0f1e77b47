//! Consolidation under a migration budget (paper 000 s4.4; SPEC section 11): every so often, choose
//! a few non-empty hosts, take them out of scheduling and migrate their VMs onto other non-empty
//! hosts, so that they empty (for maintenance, power-off or the largest VMs) sooner than they would
//! by themselves. An emptied host returns to service at once.
//!
//! Migrations cost (a memory copy, a pause, network), so they run under a budget: a number of
//! migrations per host-day, accrued continuously into a bucket one day deep, and at most
//! `max_in_flight` at once. A host is started only when the bucket holds every migration planned
//! for it, so migrations never outrun the budget. Operators run this as OpenStack Watcher's server consolidation, VMware DPM or BtrPlace;
//! Borg defragments a pool when its empty hosts run low ([`ConsolidationConfig::empty_below_pct`]).
//!
//! Which hosts to empty is the chooser's ([`ChooserKind`], scored in [`score`]): model-free ones
//! (fewest VMs, least used, the VMs' ages) and lifetime-aware ones that read each VM's
//! remaining-lifetime distribution given its age. This module holds the settings and the record of
//! a consolidation in progress (serialisable, as the store keeps it); [`crate::Allocator`] applies
//! it to the inventory (`allocator/consolidate.rs`).

pub mod batches;
pub mod score;

use crate::defrag::{Migration, MAX_IN_FLIGHT};
use domain::{HostId, Validate, ValidationError, ValidationLimits, VmId};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

/// How the hosts to empty are chosen.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum ChooserKind {
    /// Fewest VMs first, then least used (OpenStack Watcher's choice); VMs move in arrival order.
    #[default]
    FewestVms,
    /// Least used first (the larger of its CPU and memory shares), then fewest VMs.
    LeastUsed,
    /// The VMs' ages alone, read as a heavy-tailed remaining lifetime (an old VM tends to stay):
    /// scored as [`ChooserKind::Lifetime`] is, with no model.
    Age,
    /// [`ChooserKind::Age`] that also reads the VMs' batches ([`batches`]): the model-free part of
    /// [`ChooserKind::Lifetime`], to show what the model adds.
    AgeBatches,
    /// Lifetime-aware: each VM's remaining-lifetime distribution given its age, from the model the
    /// allocator repredicts with (its initial prediction minus its age without one).
    Lifetime,
    /// [`ChooserKind::Lifetime`] reading true remaining lifetimes: the ceiling, in simulation only
    /// (the simulator hands the allocator the trace's lifetimes).
    Oracle,
}

impl ChooserKind {
    pub const NAMES: [&'static str; 6] = ["fewest-vms", "least-used", "age", "age-batches", "lifetime", "oracle"];

    pub fn name(self) -> &'static str {
        match self {
            ChooserKind::FewestVms => "fewest-vms",
            ChooserKind::LeastUsed => "least-used",
            ChooserKind::Age => "age",
            ChooserKind::AgeBatches => "age-batches",
            ChooserKind::Lifetime => "lifetime",
            ChooserKind::Oracle => "oracle",
        }
    }

    /// Whether it scores hosts by the VMs' remaining-lifetime distributions.
    pub fn reads_lifetimes(self) -> bool {
        matches!(self, ChooserKind::Age | ChooserKind::AgeBatches | ChooserKind::Lifetime | ChooserKind::Oracle)
    }

    /// Whether it lets a VM whose batch is leaving leave by itself ([`batches`]).
    pub fn reads_batches(self) -> bool {
        matches!(self, ChooserKind::AgeBatches | ChooserKind::Lifetime)
    }
}

impl FromStr for ChooserKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::NAMES
            .iter()
            .position(|n| *n == text.trim())
            .map(|i| [Self::FewestVms, Self::LeastUsed, Self::Age, Self::AgeBatches, Self::Lifetime, Self::Oracle][i])
            .ok_or_else(|| format!("unknown chooser {text:?}: use one of {}", Self::NAMES.join(", ")))
    }
}

/// The `[consolidation]` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ConsolidationConfig {
    /// Migrations allowed per host of the inventory per day.
    pub budget_per_host_day: f64,
    pub chooser: ChooserKind,
    /// Seconds between consolidation rounds.
    pub every_s: f64,
    /// Most consolidation migrations in flight at once.
    #[serde(deserialize_with = "domain::whole_number::deserialize")]
    pub max_in_flight: usize,
    /// Borg's trigger: a round chooses hosts only while the empty hosts are fewer than this share
    /// of the inventory, in percent (none: every round).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty_below_pct: Option<f64>,
    /// How long one migration takes, in seconds (the simulator's; the service's estimate of the
    /// caller's, for scoring).
    pub migration_s: f64,
    /// Lifetime-aware choosers: a host any of whose moves would be wasted (the VM gone within an
    /// hour of its move) with at least this chance is left alone ([`score::WasteRule`]).
    pub max_waste: f64,
    /// Lifetime-aware choosers read the VMs of only this many hosts each round, the best ranked
    /// (what keeps a round cheap in a large zone).
    #[serde(deserialize_with = "domain::whole_number::deserialize")]
    pub candidates: usize,
}

impl Default for ConsolidationConfig {
    fn default() -> Self {
        ConsolidationConfig {
            budget_per_host_day: 0.1,
            chooser: ChooserKind::default(),
            every_s: 3600.0,
            max_in_flight: 3,
            empty_below_pct: None,
            migration_s: 1200.0,
            max_waste: 0.5,
            candidates: 2048,
        }
    }
}

/// The largest budget, migrations per host-day.
pub const MAX_BUDGET: f64 = 1e6;
/// The longest period or migration, in seconds (about 30 years).
pub const MAX_SECONDS: f64 = 1e9;

/// A setting that means nothing; names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("consolidation.{field}: {message}")]
pub struct ConsolidationConfigError {
    pub field: &'static str,
    pub message: String,
}

impl ConsolidationConfig {
    /// Refuses settings that mean nothing, naming the field and what it takes.
    pub fn check(&self) -> Result<(), ConsolidationConfigError> {
        let bad = |field: &'static str, message: String| Err(ConsolidationConfigError { field, message });
        // Bounded so that the budget and the clock stay finite numbers.
        let positive = |v: f64| v.is_finite() && v > 0.0 && v <= MAX_SECONDS;
        if !(self.budget_per_host_day.is_finite() && (0.0..=MAX_BUDGET).contains(&self.budget_per_host_day)) {
            return bad(
                "budget_per_host_day",
                format!("must be 0 to {MAX_BUDGET} migrations, got {}", self.budget_per_host_day),
            );
        }
        if !positive(self.every_s) {
            return bad("every_s", format!("must be > 0 and at most {MAX_SECONDS} seconds, got {}", self.every_s));
        }
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return bad("max_in_flight", format!("must be between 1 and {MAX_IN_FLIGHT}, got {}", self.max_in_flight));
        }
        if let Some(pct) = self.empty_below_pct.filter(|p| !(p.is_finite() && (0.0..=100.0).contains(p))) {
            return bad("empty_below_pct", format!("must be a percentage between 0 and 100, got {pct}"));
        }
        if !(self.migration_s.is_finite() && (0.0..=MAX_SECONDS).contains(&self.migration_s)) {
            return bad("migration_s", format!("must be 0 to {MAX_SECONDS} seconds, got {}", self.migration_s));
        }
        if !(self.max_waste > 0.0 && self.max_waste <= 1.0) {
            return bad("max_waste", format!("must be a probability in (0, 1], got {}", self.max_waste));
        }
        if self.candidates == 0 {
            return bad("candidates", "must be at least 1 host".into());
        }
        Ok(())
    }

    /// Migrations the budget grants per second for `hosts` hosts.
    pub fn rate_per_s(&self, hosts: usize) -> f64 {
        self.budget_per_host_day * hosts as f64 / 86_400.0
    }

    /// The most the budget's bucket holds for `hosts` hosts: one day of migrations.
    pub fn depth(&self, hosts: usize) -> f64 {
        self.budget_per_host_day * hosts as f64
    }
}

impl Validate for ConsolidationConfig {
    fn validate(&self, _limits: &ValidationLimits, _path: &str) -> Result<(), ValidationError> {
        let ok = self.check().map_err(|e| ValidationError::invalid(e.field, e.message));
        if ok.is_ok() && self.chooser == ChooserKind::Oracle {
            return Err(ValidationError::invalid(
                "chooser",
                "`oracle` reads true lifetimes, which only the simulator knows: use `lifetime` or a model-free chooser",
            ));
        }
        ok
    }
}

/// The command-line form: `off`, or `budget=MIGRATIONS_PER_HOST_DAY,chooser=NAME` with optional
/// `every=SECONDS`, `in-flight=N`, `empty-below=PCT`, `migration=SECONDS`, `max-waste=P` and
/// `candidates=N`. `None` for `off`.
pub fn parse_flag(text: &str) -> Result<Option<ConsolidationConfig>, String> {
    if text.trim() == "off" {
        return Ok(None);
    }
    let mut config = ConsolidationConfig::default();
    let mut budget = false;
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not KEY=VALUE (e.g. budget=0.1,chooser=lifetime, or off)"))?;
        let number = || value.trim().parse::<f64>().map_err(|_| format!("{key}: {value:?} is not a number"));
        let whole = || value.trim().parse::<usize>().map_err(|_| format!("{key}: {value:?} is not a whole number"));
        match key.trim() {
            "budget" => {
                config.budget_per_host_day = number()?;
                budget = true;
            }
            "chooser" => config.chooser = value.parse()?,
            "every" => config.every_s = number()?,
            "in-flight" => config.max_in_flight = whole()?,
            "empty-below" => config.empty_below_pct = Some(number()?),
            "migration" => config.migration_s = number()?,
            "max-waste" => config.max_waste = number()?,
            "candidates" => config.candidates = whole()?,
            other => {
                return Err(format!(
                    "unknown key {other:?}: use budget, chooser, every, in-flight, empty-below, migration, \
                     max-waste or candidates"
                ))
            }
        }
    }
    if !budget {
        return Err("budget=MIGRATIONS_PER_HOST_DAY is required (or off)".into());
    }
    config.check().map_err(|e| e.to_string())?;
    Ok(Some(config))
}

impl fmt::Display for ConsolidationConfig {
    /// The command-line form, with every setting that differs from the default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = ConsolidationConfig::default();
        write!(f, "budget={},chooser={}", self.budget_per_host_day, self.chooser.name())?;
        let numbers = [
            ("every", self.every_s, d.every_s),
            ("migration", self.migration_s, d.migration_s),
            ("max-waste", self.max_waste, d.max_waste),
        ];
        for (key, value, default) in numbers {
            if value != default {
                write!(f, ",{key}={value}")?;
            }
        }
        if self.max_in_flight != d.max_in_flight {
            write!(f, ",in-flight={}", self.max_in_flight)?;
        }
        if self.candidates != d.candidates {
            write!(f, ",candidates={}", self.candidates)?;
        }
        if let Some(pct) = self.empty_below_pct {
            write!(f, ",empty-below={pct}")?;
        }
        Ok(())
    }
}

/// A host being emptied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmptyingHost {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub host: HostId,
    pub started_at_s: f64,
    /// VMs still to migrate, next first.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub queue: VecDeque<VmId>,
    /// What the chooser expected: migrations, and wasted ones (lifetime-aware choosers).
    pub expected_migrations: f64,
    pub expected_wasted: f64,
    /// Migrations of its VMs completed so far.
    pub moved: u32,
    /// Since when its next VM has found no non-empty host to go to (it is tried again as hosts
    /// change; the host goes back to service after a round of that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stuck_since_s: Option<f64>,
}

/// What consolidation has done so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConsolidationCounters {
    pub rounds: u64,
    /// Rounds that chose hosts (the trigger held and the budget had room).
    pub rounds_choosing: u64,
    pub hosts_started: u64,
    pub hosts_emptied: u64,
    /// Hosts given back to service before they emptied (a VM found no non-empty host to go to
    /// for a whole round, or an operator took the host over).
    pub hosts_abandoned: u64,
    /// Times a VM found no non-empty host to go to when its turn came.
    pub no_target: u64,
    pub migrations_started: u64,
    pub migrations_completed: u64,
    /// VMs that exited before their turn: migrations saved.
    pub avoided: u64,
    /// VMs that exited while migrating.
    pub cancelled: u64,
    /// Moved VMs that exited within an hour of their move.
    pub wasted: u64,
    /// Memory moved by completed migrations, GiB.
    pub moved_gib: f64,
}

/// A VM moved lately, kept for an hour to tell a wasted migration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecentMove {
    pub vm: VmId,
    pub at_s: f64,
}

/// A moved VM that exits within this many seconds of its move was a wasted migration.
pub const WASTED_WITHIN_S: f64 = 3600.0;

/// Consolidation on an allocator: its settings, budget, hosts being emptied and migrations in
/// flight (persisted as JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Consolidation {
    pub config: ConsolidationConfig,
    pub paused: bool,
    /// Migrations the budget holds now (negative: owed, after waiting VMs had to move).
    pub budget: f64,
    /// When the budget was last accrued.
    pub budget_at_s: f64,
    /// When the next round is due.
    pub next_round_s: f64,
    pub hosts: Vec<EmptyingHost>,
    pub in_flight: Vec<Migration>,
    pub counters: ConsolidationCounters,
    pub recent_moves: VecDeque<RecentMove>,
}

impl Consolidation {
    /// Consolidation under `config`, its first round `every_s` after `now_s`, the budget empty.
    pub fn new(config: ConsolidationConfig, now_s: f64) -> Self {
        Consolidation {
            next_round_s: now_s + config.every_s,
            config,
            paused: false,
            budget: 0.0,
            budget_at_s: now_s,
            hosts: Vec::new(),
            in_flight: Vec::new(),
            counters: ConsolidationCounters::default(),
            recent_moves: VecDeque::new(),
        }
    }

    /// Adds what the budget earned since it was last accrued, up to one day's worth.
    pub fn accrue(&mut self, now_s: f64, hosts: usize) {
        if now_s > self.budget_at_s {
            let earned = self.config.rate_per_s(hosts) * (now_s - self.budget_at_s);
            self.budget = (self.budget + earned).min(self.config.depth(hosts));
            self.budget_at_s = now_s;
        }
    }

    /// Migrations planned for the hosts being emptied and not started yet.
    pub fn committed(&self) -> usize {
        self.hosts.iter().map(|h| h.queue.len()).sum()
    }

    /// What the budget can still plan for: its migrations less those already planned.
    pub fn available(&self) -> f64 {
        self.budget - self.committed() as f64
    }

    /// What a round may plan: what the budget can pay for, and no more than the migrations in
    /// flight can carry out before the next round (a host planned beyond that would wait out of
    /// service for its turn, holding capacity while it gains nothing).
    pub fn room(&self) -> f64 {
        let config = &self.config;
        let per_round = config.max_in_flight as f64 * (config.every_s / config.migration_s.max(1.0)).max(1.0);
        self.available().min(per_round - (self.committed() + self.in_flight.len()) as f64)
    }

    pub fn has_room(&self) -> bool {
        self.in_flight.len() < self.config.max_in_flight
    }

    pub fn is_emptying(&self, host: &HostId) -> bool {
        self.hosts.iter().any(|h| &h.host == host)
    }

    /// Whether `vm` is migrating under this consolidation.
    pub fn is_migrating(&self, vm: &VmId) -> bool {
        self.in_flight.iter().any(|m| &m.vm_id == vm)
    }

    /// A VM left (exited): a saved migration if it was waiting for its turn, an abandoned one if it
    /// was moving, a wasted one if it moved within the hour. Returns whether this changed the
    /// record.
    pub fn vm_exited(&mut self, vm: &VmId, now_s: f64) -> bool {
        let mut changed = false;
        for host in &mut self.hosts {
            if let Some(at) = host.queue.iter().position(|v| v == vm) {
                host.queue.remove(at);
                self.counters.avoided += 1;
                changed = true;
            }
        }
        if let Some(at) = self.in_flight.iter().position(|m| &m.vm_id == vm) {
            self.in_flight.remove(at);
            self.counters.cancelled += 1;
            changed = true;
        }
        self.forget_old_moves(now_s);
        if let Some(at) = self.recent_moves.iter().position(|m| &m.vm == vm) {
            self.recent_moves.remove(at);
            self.counters.wasted += 1;
            changed = true;
        }
        changed
    }

    /// Moves older than [`WASTED_WITHIN_S`] can no longer be wasted.
    pub fn forget_old_moves(&mut self, now_s: f64) {
        while self.recent_moves.front().is_some_and(|m| now_s - m.at_s > WASTED_WITHIN_S) {
            self.recent_moves.pop_front();
        }
    }

    /// Where consolidation stands.
    pub fn report(&self) -> ConsolidationReport {
        ConsolidationReport {
            config: self.config.clone(),
            paused: self.paused,
            budget: self.budget,
            next_round_s: self.next_round_s,
            hosts: self.hosts.clone(),
            in_flight: self.in_flight.clone(),
            counters: self.counters.clone(),
        }
    }
}

/// Where consolidation stands, as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConsolidationReport {
    pub config: ConsolidationConfig,
    pub paused: bool,
    /// Migrations the budget holds now.
    pub budget: f64,
    pub next_round_s: f64,
    pub hosts: Vec<EmptyingHost>,
    pub in_flight: Vec<Migration>,
    pub counters: ConsolidationCounters,
}

/// One host a round would empty (or empties), as the chooser saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlannedHost {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub host: HostId,
    /// VMs to migrate, in order.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub moves: Vec<VmId>,
    /// Migrations expected (a VM gone before its turn needs none; lifetime-aware choosers).
    pub expected_migrations: f64,
    /// Of them, expected wasted (the VM gone within an hour of its move).
    pub expected_wasted: f64,
    /// The chooser's rank (higher first).
    pub score: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_takes_the_documented_keys_and_refuses_the_rest() {
        assert_eq!(parse_flag("off"), Ok(None));
        let config = parse_flag("budget=0.05,chooser=lifetime,every=1800,in-flight=5").unwrap().unwrap();
        assert_eq!(config.budget_per_host_day, 0.05);
        assert_eq!(config.chooser, ChooserKind::Lifetime);
        assert_eq!((config.every_s, config.max_in_flight), (1800.0, 5));
        assert_eq!(parse_flag(&config.to_string()).unwrap().unwrap(), config, "Display is the flag again");
        let borg = parse_flag("budget=0.1,chooser=fewest-vms,empty-below=10").unwrap().unwrap();
        assert_eq!(borg.empty_below_pct, Some(10.0));
        for (bad, says) in [
            ("chooser=lifetime", "budget"),
            ("budget=x,chooser=age", "not a number"),
            ("budget=0.1,chooser=best", "unknown chooser"),
            ("budget=0.1,speed=2", "unknown key"),
            ("budget=-1", "budget_per_host_day"),
            ("budget=0.1,in-flight=0", "max_in_flight"),
            ("budget=0.1,empty-below=120", "empty_below_pct"),
            ("budget", "KEY=VALUE"),
        ] {
            let error = parse_flag(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn the_budget_accrues_up_to_a_day_and_counts_what_is_planned() {
        let config = ConsolidationConfig { budget_per_host_day: 0.5, ..ConsolidationConfig::default() };
        let mut c = Consolidation::new(config, 0.0);
        c.accrue(43_200.0, 10);
        assert!((c.budget - 2.5).abs() < 1e-9, "half a day of 5 a day: {}", c.budget);
        c.accrue(10.0 * 86_400.0, 10);
        assert_eq!(c.budget, 5.0, "one day deep");
        c.hosts.push(EmptyingHost {
            host: HostId::from("h"),
            started_at_s: 0.0,
            queue: [VmId::from("a"), VmId::from("b")].into(),
            expected_migrations: 2.0,
            expected_wasted: 0.0,
            moved: 0,
            stuck_since_s: None,
        });
        assert_eq!(c.available(), 3.0, "the planned migrations are spoken for");
        // Hourly rounds, 3 in flight of 20 minutes: 9 migrations a round, 2 of them planned.
        assert_eq!(c.room(), 3.0);
        c.budget = 100.0;
        assert_eq!(c.room(), 7.0, "no more than the migrations in flight carry out in a round");
        c.budget = 5.0;
        assert!(c.vm_exited(&VmId::from("a"), 1.0));
        assert!(!c.vm_exited(&VmId::from("z"), 1.0));
        assert_eq!((c.counters.avoided, c.available()), (1, 4.0));
    }

    #[test]
    fn a_moved_vm_that_exits_within_the_hour_is_a_wasted_migration() {
        let mut c = Consolidation::new(ConsolidationConfig::default(), 0.0);
        c.recent_moves.push_back(RecentMove { vm: VmId::from("early"), at_s: 0.0 });
        c.recent_moves.push_back(RecentMove { vm: VmId::from("late"), at_s: 1000.0 });
        assert!(!c.vm_exited(&VmId::from("early"), 3_700.0), "moved 3,700 s ago: not wasted");
        assert!(c.vm_exited(&VmId::from("late"), 3_700.0));
        assert_eq!(c.counters.wasted, 1);
    }
}
