//! Lifetime classes of VMs and hosts, as the lifetime-aware rules see them (paper 003 s3.1, Alg. 2).
//!
//! A policy divides lifetimes into classes by cut-offs (`[2 h]` for LA-binary, `15*2^i` minutes for
//! LA-multiclass). A VM's class comes from its prediction; a host's class is the class of the largest
//! predicted remaining lifetime of its VMs, which falls as time passes. So that cached rule results
//! stay exact, a host's class is recomputed only at events: a VM placed or released, or the moment
//! its remaining lifetime crosses the next cut-off down ([`HostLifetime::next_change_s`]), which the
//! allocator schedules.

use domain::{LifetimeClass, LifetimePrediction};

/// Lifetime class index: 0 is the shortest class.
pub type ClassIndex = u8;

/// Cut-offs between lifetime classes, in seconds, strictly increasing; class `i` holds lifetimes in
/// `[cutoffs[i-1], cutoffs[i])`.
#[derive(Clone, Debug, PartialEq)]
pub struct LifetimeClasses {
    cutoffs_s: Vec<f64>,
    /// Whether a prediction's `interval_class` is an index into these classes (LA-multiclass, whose
    /// classes are the interval model's). Otherwise an interval class is read as a lifetime in the
    /// interval model's own classes.
    reads_interval: bool,
    /// P(long) from which a prediction is long, instead of its own class.
    long_probability: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClassesError {
    #[error("lifetime cut-offs must be finite, positive and strictly increasing, got {0:?}")]
    NotIncreasing(Vec<f64>),
    #[error("at most {max} lifetime cut-offs are supported, got {got}")]
    TooMany { max: usize, got: usize },
}

impl LifetimeClasses {
    /// Most cut-offs (so at most 32 classes).
    pub const MAX_CUTOFFS: usize = 31;

    pub fn new(cutoffs_s: Vec<f64>) -> Result<Self, ClassesError> {
        if cutoffs_s.len() > Self::MAX_CUTOFFS {
            return Err(ClassesError::TooMany { max: Self::MAX_CUTOFFS, got: cutoffs_s.len() });
        }
        let increasing = cutoffs_s.windows(2).all(|w| w[0] < w[1]);
        if cutoffs_s.is_empty() || !increasing || cutoffs_s.iter().any(|c| !c.is_finite() || *c <= 0.0) {
            return Err(ClassesError::NotIncreasing(cutoffs_s));
        }
        Ok(LifetimeClasses { cutoffs_s, reads_interval: true, long_probability: None })
    }

    /// The same classes, reading a prediction's expected lifetime before its interval class, and the
    /// interval class as a lifetime of the interval model's classes (NILAS, LAVA).
    pub fn by_expected_lifetime(self) -> Self {
        LifetimeClasses { reads_interval: false, ..self }
    }

    /// The same classes, taking a VM as long-lived when its P(long) is at least `probability` (the
    /// prediction's own class otherwise).
    pub fn reading_long(self, probability: Option<f64>) -> Self {
        LifetimeClasses { long_probability: probability, ..self }
    }

    /// Two classes split at `threshold_s` (LA-binary).
    pub fn binary(threshold_s: f64) -> Result<Self, ClassesError> {
        Self::new(vec![threshold_s])
    }

    /// The lifetime-interval model's default classes: cut-offs at 15 * 2^i minutes, i = 0..10.
    pub fn doubling_from_15_minutes() -> Self {
        LifetimeClasses {
            cutoffs_s: (0..10).map(|i| 900.0 * f64::from(1u32 << i)).collect(),
            reads_interval: true,
            long_probability: None,
        }
    }

    /// Whether a prediction's interval class is an index into these classes.
    pub fn reads_interval(&self) -> bool {
        self.reads_interval
    }

    pub fn cutoffs_s(&self) -> &[f64] {
        &self.cutoffs_s
    }

    pub fn count(&self) -> usize {
        self.cutoffs_s.len() + 1
    }

    /// Class of a lifetime (or remaining lifetime) in seconds.
    pub fn class_of(&self, lifetime_s: f64) -> ClassIndex {
        self.cutoffs_s.partition_point(|&c| c <= lifetime_s) as ClassIndex
    }

    /// A representative lifetime of a class, for predictions that carry only a class: the
    /// geometric middle of its interval, half the first cut-off for class 0, and twice the last
    /// cut-off for the open top class.
    pub fn representative_s(&self, class: ClassIndex) -> f64 {
        let class = usize::from(class).min(self.cutoffs_s.len());
        match class {
            0 => self.cutoffs_s[0] / 2.0,
            c if c == self.cutoffs_s.len() => self.cutoffs_s[c - 1] * 2.0,
            c => (self.cutoffs_s[c - 1] * self.cutoffs_s[c]).sqrt(),
        }
    }

    /// The predicted lifetime a VM is placed with, in seconds, and its class.
    ///
    /// In order: a missing or fallback prediction is short-lived (lifetime 0, class 0); an
    /// `interval_class` (the multi-class model) gives the class and its representative lifetime; an
    /// `expected_lifetime_s` gives both; a bare binary class gives the first long class with an
    /// unknown, so unbounded, lifetime for "long" and class 0 for "short". A VM predicted long is
    /// never put below the first long class (two classes: the class above the threshold).
    pub fn vm_lifetime(&self, prediction: Option<&LifetimePrediction>) -> VmLifetime {
        let Some(prediction) = prediction.filter(|p| !p.source.is_fallback()) else {
            return VmLifetime::SHORT;
        };
        let long = match self.long_probability {
            Some(threshold) => prediction.p_long >= threshold,
            None => prediction.placement_class() == LifetimeClass::Long,
        };
        let top = (self.count() - 1) as ClassIndex;
        let interval_lifetime = |interval: u32| {
            let model_classes = Self::doubling_from_15_minutes();
            model_classes.representative_s(interval.min(model_classes.count() as u32 - 1) as ClassIndex)
        };
        let (class, lifetime_s) = if let Some(interval) = prediction.interval_class.filter(|_| self.reads_interval) {
            let class = interval.min(u32::from(top)) as ClassIndex;
            (class, self.representative_s(class))
        } else if let Some(expected) =
            prediction.expected_lifetime_s.or(prediction.interval_class.map(interval_lifetime))
        {
            (self.class_of(expected), expected)
        } else if long {
            (self.first_long_class(), f64::INFINITY)
        } else {
            return VmLifetime::SHORT;
        };
        if long && class < self.first_long_class() {
            // The binary classifier outranks a shorter regression estimate: a long VM is placed as
            // long, and keeps its host long for at least the threshold.
            let floor = self.cutoffs_s[usize::from(self.first_long_class()) - 1];
            return VmLifetime { class: self.first_long_class(), lifetime_s: lifetime_s.max(floor) };
        }
        VmLifetime { class, lifetime_s }
    }

    /// The lowest class whose lifetimes are "long" under a two-class split; with several cut-offs,
    /// the class just above 2 hours (the binary model's threshold), or 1 when no cut-off reaches it.
    fn first_long_class(&self) -> ClassIndex {
        if self.cutoffs_s.len() == 1 {
            return 1;
        }
        (self.class_of(domain::prediction::DEFAULT_LONG_THRESHOLD_S).max(1)) as ClassIndex
    }
}

/// A time in seconds with a total order (`f64::total_cmp`), for sorted sets and heaps of times:
/// hosts by exit time (minus infinity, empty hosts, first), host events by due time.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) struct OrderedTime(pub f64);

impl Eq for OrderedTime {}
impl PartialOrd for OrderedTime {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrderedTime {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A VM's predicted lifetime as the lifetime rules use it.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct VmLifetime {
    pub class: ClassIndex,
    /// Predicted total lifetime in seconds; infinite when only "long" is known.
    pub lifetime_s: f64,
}

impl VmLifetime {
    pub const SHORT: VmLifetime = VmLifetime { class: 0, lifetime_s: 0.0 };
}

/// The lifetime summary of one host: when its last VM is predicted to exit, and its class now.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct HostLifetime {
    /// Largest predicted exit time (placement time + predicted lifetime) over its VMs; minus
    /// infinity for an empty host.
    pub exit_s: f64,
    /// Class of the largest predicted remaining lifetime, as of the last event.
    pub class: ClassIndex,
    /// When the class next drops if nothing else happens (infinity: never).
    pub next_change_s: f64,
    /// The host's code under the policy's per-host state ([`crate::host_state`]; 0 without one):
    /// what a host-coded rule such as LAVA's reads.
    pub state_code: u32,
}

impl HostLifetime {
    pub const EMPTY: HostLifetime =
        HostLifetime { exit_s: f64::NEG_INFINITY, class: 0, next_change_s: f64::INFINITY, state_code: 0 };

    /// The summary of a host whose VMs exit at `exit_s` at the latest, seen at `now_s`.
    pub fn at(classes: &LifetimeClasses, exit_s: f64, now_s: f64) -> HostLifetime {
        if exit_s == f64::NEG_INFINITY {
            return HostLifetime::EMPTY;
        }
        let remaining = exit_s - now_s;
        // Strictly above a cut-off to be in the class over it: the class drops at the very instant
        // the remaining lifetime reaches the cut-off, which is when the drop is scheduled.
        let class = classes.cutoffs_s.partition_point(|&c| c < remaining) as ClassIndex;
        // The class drops when the remaining lifetime reaches the cut-off under it.
        let next_change_s = match class {
            0 => f64::INFINITY,
            c => exit_s - classes.cutoffs_s[usize::from(c) - 1],
        };
        HostLifetime { exit_s, class, next_change_s, state_code: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::PredictionSource;

    fn prediction(class: LifetimeClass, expected: Option<f64>, interval: Option<u32>) -> LifetimePrediction {
        LifetimePrediction {
            p_long: if class == LifetimeClass::Long { 0.9 } else { 0.1 },
            class,
            interval_class: interval,
            expected_lifetime_s: expected,
            model_version: None,
            source: PredictionSource::Model,
        }
    }

    #[test]
    fn classes_follow_the_cutoffs() {
        let classes = LifetimeClasses::doubling_from_15_minutes();
        assert_eq!(classes.count(), 11);
        assert_eq!(classes.class_of(0.0), 0);
        assert_eq!(classes.class_of(899.0), 0);
        assert_eq!(classes.class_of(900.0), 1);
        assert_eq!(classes.class_of(7200.0), 4);
        assert_eq!(classes.class_of(1e9), 10);
        assert!(LifetimeClasses::new(vec![10.0, 10.0]).is_err());
        assert!(LifetimeClasses::new(vec![]).is_err());
    }

    #[test]
    fn vm_lifetime_prefers_interval_then_expected_then_binary() {
        let binary = LifetimeClasses::binary(7200.0).unwrap();
        assert_eq!(binary.vm_lifetime(None), VmLifetime::SHORT);
        let fallback = LifetimePrediction::fallback(PredictionSource::FallbackTimeout);
        assert_eq!(binary.vm_lifetime(Some(&fallback)), VmLifetime::SHORT);
        let bare_long = prediction(LifetimeClass::Long, None, None);
        assert_eq!(binary.vm_lifetime(Some(&bare_long)), VmLifetime { class: 1, lifetime_s: f64::INFINITY });
        // Long by the classifier but a short regression estimate: long, for at least the threshold.
        let long_short_estimate = prediction(LifetimeClass::Long, Some(600.0), None);
        assert_eq!(binary.vm_lifetime(Some(&long_short_estimate)), VmLifetime { class: 1, lifetime_s: 7200.0 });
        let short = prediction(LifetimeClass::Short, Some(600.0), None);
        assert_eq!(binary.vm_lifetime(Some(&short)), VmLifetime { class: 0, lifetime_s: 600.0 });

        let multi = LifetimeClasses::doubling_from_15_minutes();
        let with_interval = prediction(LifetimeClass::Long, Some(1e6), Some(6));
        let vm = multi.vm_lifetime(Some(&with_interval));
        assert_eq!(vm.class, 6);
        assert_eq!(multi.class_of(vm.lifetime_s), 6, "the representative lies in its class");
    }

    #[test]
    fn host_class_drops_at_the_scheduled_times() {
        let classes = LifetimeClasses::binary(7200.0).unwrap();
        // A VM placed at t=0 predicted to live 5 h: long until 3 h, then short.
        let host = HostLifetime::at(&classes, 18_000.0, 0.0);
        assert_eq!((host.class, host.next_change_s), (1, 10_800.0));
        let later = HostLifetime::at(&classes, 18_000.0, 10_800.0);
        assert_eq!((later.class, later.next_change_s), (0, f64::INFINITY));
        assert_eq!(HostLifetime::at(&classes, f64::NEG_INFINITY, 5.0), HostLifetime::EMPTY);
    }
}
