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

/// How many consolidation migrations may be in flight at once.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum InFlightLimit {
    /// Enough to carry out the budget on the zone as it is: [`AUTO_HEADROOM`] times the migrations
    /// the budget keeps in flight on average (its rate times how long one takes), at least
    /// [`AUTO_MIN_IN_FLIGHT`] ([`ConsolidationConfig::in_flight_limit`]).
    #[default]
    Auto,
    /// This many, whatever the zone's size.
    Fixed(usize),
}

/// `auto`'s default factor over the migrations the budget keeps in flight on average
/// ([`ConsolidationConfig::auto_headroom`]): rounds start hosts in bursts, so a limit of exactly
/// the average leaves part of the budget unspent. Chosen on validation windows of two zone sizes
/// (`configs/experiments/consolidation-validation-4.toml`; docs/evaluation.md, "Round 5"): the
/// smallest headroom that carried out 0.25 a host-day on every Azure V1 window (774-1,013 hosts;
/// 1 did not); on Huawei's 82-87 hosts the least, 3, binds nothing.
pub const AUTO_HEADROOM: f64 = 1.5;
/// The largest `auto_headroom`.
pub const MAX_HEADROOM: f64 = 100.0;
/// `auto`'s least limit (the fixed default before issue 59).
pub const AUTO_MIN_IN_FLIGHT: usize = 3;

impl fmt::Display for InFlightLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InFlightLimit::Auto => f.write_str("auto"),
            InFlightLimit::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for InFlightLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "auto" => Ok(InFlightLimit::Auto),
            number => number
                .parse()
                .map(InFlightLimit::Fixed)
                .map_err(|_| format!("{text:?} is neither `auto` nor a whole number of migrations")),
        }
    }
}

impl Serialize for InFlightLimit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            InFlightLimit::Auto => serializer.serialize_str("auto"),
            InFlightLimit::Fixed(n) => serializer.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for InFlightLimit {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LimitVisitor;
        impl<'de> serde::de::Visitor<'de> for LimitVisitor {
            type Value = InFlightLimit;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"auto\" or a whole number of migrations")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<InFlightLimit, E> {
                match text {
                    "auto" => Ok(InFlightLimit::Auto),
                    other => Err(E::custom(format!("{other:?} is neither \"auto\" nor a whole number of migrations"))),
                }
            }

            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<InFlightLimit, E> {
                domain::whole_number::deserialize(serde::de::value::U64Deserializer::<E>::new(value))
                    .map(InFlightLimit::Fixed)
            }

            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<InFlightLimit, E> {
                domain::whole_number::deserialize(serde::de::value::I64Deserializer::<E>::new(value))
                    .map(InFlightLimit::Fixed)
            }

            fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<InFlightLimit, E> {
                domain::whole_number::deserialize(serde::de::value::F64Deserializer::<E>::new(value))
                    .map(InFlightLimit::Fixed)
            }
        }
        deserializer.deserialize_any(LimitVisitor)
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
    /// Most consolidation migrations in flight at once: `auto` (sized to carry out the budget) or
    /// a number.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub max_in_flight: InFlightLimit,
    /// `auto`'s factor over the migrations the budget keeps in flight on average.
    pub auto_headroom: f64,
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
            max_in_flight: InFlightLimit::Auto,
            auto_headroom: AUTO_HEADROOM,
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
        if let InFlightLimit::Fixed(n) = self.max_in_flight {
            if n == 0 || n > MAX_IN_FLIGHT {
                return bad("max_in_flight", format!("must be `auto` or between 1 and {MAX_IN_FLIGHT}, got {n}"));
            }
        }
        if !(self.auto_headroom > 0.0 && self.auto_headroom <= MAX_HEADROOM) {
            return bad("auto_headroom", format!("must be > 0 and at most {MAX_HEADROOM}, got {}", self.auto_headroom));
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

    /// The migrations in flight on average while the budget is spent on `hosts` hosts: its rate
    /// times how long one migration takes (Little's law).
    pub fn budget_in_flight(&self, hosts: usize) -> f64 {
        self.rate_per_s(hosts) * self.migration_s
    }

    /// The most migrations in flight at once on `hosts` hosts.
    pub fn in_flight_limit(&self, hosts: usize) -> usize {
        match self.max_in_flight {
            InFlightLimit::Fixed(n) => n,
            InFlightLimit::Auto => {
                let wanted = (self.auto_headroom * self.budget_in_flight(hosts)).ceil();
                // `wanted` is finite and non-negative (the settings are checked); clamped before the cast.
                wanted.clamp(AUTO_MIN_IN_FLIGHT as f64, MAX_IN_FLIGHT as f64) as usize
            }
        }
    }

    /// The migrations per host-day the in-flight limit can carry out on `hosts` hosts, when that
    /// is less than the budget (the rest of the budget goes unspent): said at start and in the
    /// report.
    pub fn budget_shortfall(&self, hosts: usize) -> Option<f64> {
        if hosts == 0 || self.migration_s <= 0.0 {
            return None;
        }
        let most = self.in_flight_limit(hosts) as f64 * 86_400.0 / self.migration_s / hosts as f64;
        (most < self.budget_per_host_day).then_some(most)
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
/// `every=SECONDS`, `in-flight=N|auto`, `headroom=FACTOR`, `empty-below=PCT`, `migration=SECONDS`, `max-waste=P` and
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
            "in-flight" => config.max_in_flight = value.parse().map_err(|e| format!("{key}: {e}"))?,
            "headroom" => config.auto_headroom = number()?,
            "empty-below" => config.empty_below_pct = Some(number()?),
            "migration" => config.migration_s = number()?,
            "max-waste" => config.max_waste = number()?,
            "candidates" => config.candidates = whole()?,
            other => {
                return Err(format!(
                    "unknown key {other:?}: use budget, chooser, every, in-flight, headroom, empty-below, \
                     migration, max-waste or candidates"
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
            ("headroom", self.auto_headroom, d.auto_headroom),
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
    /// Migrations the cloud reported failed: the VM stayed, and its host went back to service.
    #[serde(default)]
    pub migrations_failed: u64,
    /// VMs that exited before their turn: migrations saved.
    pub avoided: u64,
    /// VMs that exited while migrating: migrations spent for nothing.
    pub cancelled: u64,
    /// Migrations wasted: moved VMs that exited within an hour of their move, and the cancelled ones.
    pub wasted: u64,
    /// The same within six hours of the move (cancelled ones included).
    #[serde(default)]
    pub wasted_6h: u64,
    /// Memory moved by completed migrations, GiB.
    pub moved_gib: f64,
}

/// A VM moved lately, kept for six hours to tell a wasted migration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecentMove {
    pub vm: VmId,
    pub at_s: f64,
}

/// A moved VM that exits within this many seconds of its move was a wasted migration.
pub const WASTED_WITHIN_S: f64 = 3600.0;
/// The longer window of the same (the reports' second figure).
pub const WASTED_WITHIN_6H_S: f64 = 6.0 * 3600.0;

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

    /// What a round may plan on `hosts` hosts: what the budget can pay for, and no more than the
    /// migrations in flight can carry out before the next round (a host planned beyond that would
    /// wait out of service for its turn, holding capacity while it gains nothing).
    pub fn room(&self, hosts: usize) -> f64 {
        let config = &self.config;
        let limit = config.in_flight_limit(hosts) as f64;
        let per_round = limit * (config.every_s / config.migration_s.max(1.0)).max(1.0);
        self.available().min(per_round - (self.committed() + self.in_flight.len()) as f64)
    }

    /// Whether another migration may start on a zone of `hosts` hosts.
    pub fn has_room(&self, hosts: usize) -> bool {
        self.in_flight.len() < self.config.in_flight_limit(hosts)
    }

    pub fn is_emptying(&self, host: &HostId) -> bool {
        self.hosts.iter().any(|h| &h.host == host)
    }

    /// Whether `vm` is migrating under this consolidation.
    pub fn is_migrating(&self, vm: &VmId) -> bool {
        self.in_flight.iter().any(|m| &m.vm_id == vm)
    }

    /// A VM left (exited): a saved migration if it was waiting for its turn, a cancelled one (and
    /// wasted) if it was moving, a wasted one if it moved within the hour (or the six hours).
    /// Returns whether this changed the record.
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
            self.counters.wasted += 1;
            self.counters.wasted_6h += 1;
            changed = true;
        }
        self.forget_old_moves(now_s);
        if let Some(at) = self.recent_moves.iter().position(|m| &m.vm == vm) {
            let moved = self.recent_moves.remove(at).map_or(now_s, |m| m.at_s);
            self.counters.wasted += u64::from(now_s - moved <= WASTED_WITHIN_S);
            self.counters.wasted_6h += 1;
            changed = true;
        }
        changed
    }

    /// Moves older than [`WASTED_WITHIN_6H_S`] can no longer be wasted.
    pub fn forget_old_moves(&mut self, now_s: f64) {
        while self.recent_moves.front().is_some_and(|m| now_s - m.at_s > WASTED_WITHIN_6H_S) {
            self.recent_moves.pop_front();
        }
    }

    /// Where consolidation stands on a zone of `hosts` hosts.
    pub fn report(&self, hosts: usize) -> ConsolidationReport {
        ConsolidationReport {
            in_flight_limit: self.config.in_flight_limit(hosts),
            budget_shortfall: self.config.budget_shortfall(hosts),
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
    /// The most migrations in flight at once on the zone as it is (`max_in_flight` resolved).
    pub in_flight_limit: usize,
    /// When the in-flight limit cannot carry out the budget: the migrations per host-day it can
    /// (the rest of the budget goes unspent; raise `max_in_flight` or set it to `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_shortfall: Option<f64>,
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
        assert_eq!((config.every_s, config.max_in_flight), (1800.0, InFlightLimit::Fixed(5)));
        let auto = parse_flag("budget=0.25,chooser=age-batches,in-flight=auto,headroom=1.5").unwrap().unwrap();
        assert_eq!((auto.max_in_flight, auto.auto_headroom), (InFlightLimit::Auto, 1.5));
        assert_eq!(parse_flag(&auto.to_string()).unwrap().unwrap(), auto, "Display is the flag again");
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
            ("budget=0.1,in-flight=many", "neither `auto` nor"),
            ("budget=0.1,headroom=0", "auto_headroom"),
            ("budget=0.1,empty-below=120", "empty_below_pct"),
            ("budget", "KEY=VALUE"),
        ] {
            let error = parse_flag(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn the_budget_accrues_up_to_a_day_and_counts_what_is_planned() {
        let config = ConsolidationConfig {
            budget_per_host_day: 0.5,
            max_in_flight: InFlightLimit::Fixed(3),
            ..ConsolidationConfig::default()
        };
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
        assert_eq!(c.room(10), 3.0);
        c.budget = 100.0;
        assert_eq!(c.room(10), 7.0, "no more than the migrations in flight carry out in a round");
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
        c.recent_moves.push_back(RecentMove { vm: VmId::from("later"), at_s: 2000.0 });
        c.in_flight.push(Migration {
            vm_id: VmId::from("moving"),
            source: HostId::from("s"),
            target: HostId::from("t"),
            started_at_s: 3000.0,
        });
        assert!(c.vm_exited(&VmId::from("early"), 3_700.0), "moved 3,700 s ago: wasted within 6 h only");
        assert!(c.vm_exited(&VmId::from("late"), 3_700.0));
        assert!(c.vm_exited(&VmId::from("moving"), 3_700.0), "cancelled: spent for nothing");
        assert!(!c.vm_exited(&VmId::from("later"), 2000.0 + 6.0 * 3600.0 + 1.0), "forgotten after 6 h");
        assert_eq!((c.counters.cancelled, c.counters.wasted, c.counters.wasted_6h), (1, 2, 3));
    }

    #[test]
    fn auto_in_flight_carries_out_the_budget_and_a_fixed_limit_says_what_it_cannot() {
        // 0.25 a host-day on 2,407 hosts, 20-minute migrations: 8.4 in flight on average.
        let config = ConsolidationConfig { budget_per_host_day: 0.25, ..ConsolidationConfig::default() };
        assert!((config.budget_in_flight(2407) - 601.75 / 72.0).abs() < 1e-9);
        assert_eq!(config.in_flight_limit(2407), (AUTO_HEADROOM * 601.75 / 72.0).ceil() as usize);
        assert_eq!(config.in_flight_limit(10), AUTO_MIN_IN_FLIGHT, "never below the least");
        assert_eq!(config.budget_shortfall(2407), None);
        let fixed = ConsolidationConfig { max_in_flight: InFlightLimit::Fixed(3), ..config };
        let most = fixed.budget_shortfall(2407).expect("3 in flight cannot carry out 0.25 on 2,407 hosts");
        assert!((most - 3.0 * 72.0 / 2407.0).abs() < 1e-9, "{most}");
        assert_eq!(fixed.budget_shortfall(100), None);
    }

    #[test]
    fn the_in_flight_limit_reads_auto_or_a_whole_number_and_writes_them_back() {
        for (text, limit) in
            [("\"auto\"", InFlightLimit::Auto), ("4", InFlightLimit::Fixed(4)), ("4.0", InFlightLimit::Fixed(4))]
        {
            assert_eq!(serde_json::from_str::<InFlightLimit>(text).unwrap(), limit, "{text}");
        }
        assert_eq!(serde_json::to_string(&InFlightLimit::Auto).unwrap(), "\"auto\"");
        assert_eq!(serde_json::to_string(&InFlightLimit::Fixed(4)).unwrap(), "4");
        for bad in ["\"many\"", "-1", "2.5"] {
            assert!(serde_json::from_str::<InFlightLimit>(bad).is_err(), "{bad}");
        }
    }
}
