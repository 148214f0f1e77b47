//! The `[agents]` settings: how many agents, how far behind the store each sees it, how hosts are assigned, retries, conflict avoidance.

use super::*;

/// How far an agent's view of the store lags behind the store when it decides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lag {
    /// The store's last `n` commits are not in the view (its own excepted).
    Commits(u64),
    /// The commits of the last `s` seconds of trace time are not in the view (its own excepted).
    Seconds(f64),
    /// `agents - 1` commits: at saturation every other agent commits once while one decides.
    Saturated,
}

impl Lag {
    /// The lag for a run of `agents` agents (`Saturated` resolved).
    pub fn resolved(self, agents: usize) -> Lag {
        match self {
            Lag::Saturated => Lag::Commits(agents.saturating_sub(1) as u64),
            other => other,
        }
    }
}

impl fmt::Display for Lag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lag::Commits(n) => write!(f, "{n}"),
            Lag::Seconds(s) => write!(f, "{s}s"),
            Lag::Saturated => f.write_str("n-1"),
        }
    }
}

impl FromStr for Lag {
    type Err = String;

    /// `8` (commits), `30s` (seconds of trace time) or `n-1` (saturated).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("n-1") {
            return Ok(Lag::Saturated);
        }
        if let Some(seconds) = text.strip_suffix('s') {
            return match seconds.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && s >= 0.0 => Ok(Lag::Seconds(s)),
                _ => Err(format!("lag `{text}`: seconds must be a number >= 0 (e.g. 30s)")),
            };
        }
        text.parse::<u64>()
            .map(Lag::Commits)
            .map_err(|_| format!("lag `{text}` is not a number of commits (8), seconds of trace time (30s) or `n-1`"))
    }
}

impl Serialize for Lag {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Lag {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Which agent an arrival goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assignment {
    /// Arrival `i` goes to agent `i mod N` (the control service spreads requests in turn).
    #[default]
    RoundRobin,
    /// Drawn uniformly with the run's seed.
    Random,
}

impl Assignment {
    pub const NAMES: [&'static str; 2] = ["round-robin", "random"];
}

/// When a VM whose commit the store refused is decided again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryMode {
    /// At once, at the same trace time, on a view brought up to date: what the real agent does
    /// after a refusal. Nothing commits in between in a replay, so this attempt succeeds; the
    /// cost of conflicts shows as the retries, and as the first attempts that other agents'
    /// retried placements refuse.
    #[default]
    Immediate,
    /// Once one lag has passed (`d` more commits, or `s` seconds), on the lagging view that then
    /// holds the refusal's cause: the other agents' commits in flight meanwhile can refuse it
    /// again (cascades, 503s). The VM is placed that much later in trace time; at the trace's own
    /// rate `d` commits take `d` times about half a second, far longer than at saturation, so the
    /// packing figures of this mode carry that shift.
    AfterLag,
}

impl RetryMode {
    pub const NAMES: [&'static str; 2] = ["immediate", "after-lag"];
}

/// What becomes of a VM whose `max_attempts` attempts at one agent were all refused (the agent
/// answered 503).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Sent again, to the next agent, one lag later (the control service's failover on a 5xx, or
    /// the client's retry): every VM runs in the end, so packing stays comparable with one agent.
    #[default]
    Resubmit,
    /// Never placed.
    Drop,
}

impl OnFailure {
    pub const NAMES: [&'static str; 2] = ["resubmit", "drop"];
}

/// Conflict avoidance (paper 001 s5.3; [`placement::ConflictAvoidance`]). With `share` (the
/// allocator service's way, `allocator/src/durable.rs`), each agent takes the best of its own share
/// of the hosts among the `top` best valid hosts (or else among the `top` per agent) whenever
/// there are other agents. Without it
/// (Protean's), each agent draws a host at random among the `top` best valid hosts instead of the
/// best ones only, with a probability `gain` times the share of its last `window` commit attempts
/// that the store refused. Both always when an agent decides a refused VM again. The defaults are
/// the service's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Avoidance {
    pub top: usize,
    pub window: usize,
    pub gain: f64,
    /// Each agent takes the best of its own share of the hosts among the top ones
    /// ([`placement::HostShare`], every agent knowing all the others) instead of a random one,
    /// and does so always when there are other agents (`gain` and `window` then play no part),
    /// as the allocator service does.
    pub share: bool,
}

impl Default for Avoidance {
    fn default() -> Self {
        Avoidance { top: 16, window: 50, gain: 10.0, share: true }
    }
}

/// The agents of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentsConfig {
    pub agents: usize,
    pub lag: Lag,
    pub assignment: Assignment,
    /// Attempts of one VM at one agent before it answers 503 (the allocator's `MAX_ATTEMPTS`).
    pub max_attempts: u32,
    /// Conflict avoidance (`None`: off).
    pub avoidance: Option<Avoidance>,
    pub on_failure: OnFailure,
    pub retry: RetryMode,
    /// Keep every VM's host in the result.
    pub record_placements: bool,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            agents: 1,
            lag: Lag::Commits(0),
            assignment: Assignment::RoundRobin,
            max_attempts: 5,
            avoidance: Some(Avoidance::default()),
            on_failure: OnFailure::Resubmit,
            retry: RetryMode::Immediate,
            record_placements: false,
        }
    }
}

impl AgentsConfig {
    pub fn validate(&self) -> Result<(), SimError> {
        if self.agents == 0 || self.agents > u32::MAX as usize {
            return Err(invalid("agents", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(invalid("max_attempts", "must be at least 1"));
        }
        if let Some(a) = self.avoidance {
            if a.top == 0 || a.window == 0 || !(a.gain.is_finite() && a.gain >= 0.0) {
                return Err(invalid("avoidance", "top and window must be at least 1, gain a number >= 0"));
            }
        }
        if let Lag::Seconds(s) = self.lag {
            if !(s.is_finite() && s >= 0.0) {
                return Err(invalid("lag", format!("must be >= 0 seconds, got {s}")));
            }
        }
        Ok(())
    }
}
