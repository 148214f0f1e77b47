//! Lifetime predictions as they travel with a request, and where each one came from.

use serde::{Deserialize, Serialize};

/// Lifetime at and above which a VM is long-lived unless configured otherwise: 2 hours (paper 003
/// s3.2.1).
pub const DEFAULT_LONG_THRESHOLD_S: f64 = 7200.0;

/// Binary lifetime class: long-lived means expected to live at least the model's threshold (2 h by
/// default).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LifetimeClass {
    Short,
    Long,
}

/// Who produced a prediction. Fallbacks and the safeguard always say "short-lived", because placing a
/// short VM as long costs more than the reverse (paper 003 s4.3).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PredictionSource {
    /// Fresh answer of the lifetime model.
    Model,
    /// A cached model answer for the same features.
    Cache,
    /// The inference server did not answer within the timeout budget.
    FallbackTimeout,
    /// The inference server answered with an error or could not be reached.
    FallbackError,
    /// No inference server is configured or healthy.
    FallbackUnavailable,
    /// The long-lived share tripped the safeguard; everything is short-lived for a cooldown.
    Safeguard,
    /// The serving model's realized quality is below the quality gate's floors: the VM is placed as
    /// short-lived, and the model's answer (`p_long`, `class`, `model_version`) is kept in shadow so
    /// that its recovery is measured.
    QualityGate,
    /// True lifetime, known only in simulation.
    Oracle,
    /// An oracle with injected noise, for accuracy sweeps in simulation.
    NoisyOracle,
}

impl PredictionSource {
    /// True for every source that stands in for a missing model answer.
    pub fn is_fallback(self) -> bool {
        matches!(
            self,
            PredictionSource::FallbackTimeout
                | PredictionSource::FallbackError
                | PredictionSource::FallbackUnavailable
                | PredictionSource::Safeguard
                | PredictionSource::QualityGate
        )
    }
}

/// A lifetime prediction for one VM.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifetimePrediction {
    /// Probability of being long-lived, in [0, 1].
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 1.0))]
    pub p_long: f64,
    /// Binary class after applying the model's decision threshold.
    pub class: LifetimeClass,
    /// Index of the predicted lifetime interval of the multi-class model, when one was asked.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole_number::option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, minimum = 0, maximum = 4_294_967_295_u64))]
    pub interval_class: Option<u32>,
    /// Expected lifetime in seconds, when the model gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub expected_lifetime_s: Option<f64>,
    /// Version of the model bundle that answered (1 to 256 bytes, no control characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$", min_length = 1, max_length = 256)
    )]
    pub model_version: Option<String>,
    pub source: PredictionSource,
}

impl LifetimePrediction {
    /// The short-lived stand-in used when no model answer can be had.
    pub fn fallback(source: PredictionSource) -> Self {
        LifetimePrediction {
            p_long: 0.0,
            class: LifetimeClass::Short,
            interval_class: None,
            expected_lifetime_s: None,
            model_version: None,
            source,
        }
    }

    /// Class the allocator acts on: fallbacks are short-lived whatever they carry.
    pub fn placement_class(&self) -> LifetimeClass {
        if self.source.is_fallback() {
            LifetimeClass::Short
        } else {
            self.class
        }
    }
}

/// Class the allocator acts on for a VM that may have no prediction at all: none means short-lived.
pub fn placement_class(prediction: Option<&LifetimePrediction>) -> LifetimeClass {
    prediction.map_or(LifetimeClass::Short, LifetimePrediction::placement_class)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_fallback_predictions_place_as_short() {
        assert_eq!(placement_class(None), LifetimeClass::Short);
        let mut p = LifetimePrediction::fallback(PredictionSource::Safeguard);
        p.class = LifetimeClass::Long;
        assert_eq!(placement_class(Some(&p)), LifetimeClass::Short);
        p.source = PredictionSource::Model;
        assert_eq!(placement_class(Some(&p)), LifetimeClass::Long);
    }

    #[test]
    fn sources_are_snake_case_on_the_wire() {
        let json = serde_json::to_string(&PredictionSource::FallbackTimeout).unwrap();
        assert_eq!(json, "\"fallback_timeout\"");
    }
}
