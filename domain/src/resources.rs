//! Resource vectors: what a host offers and what a VM demands.
//!
//! Amounts are kept as integers in fixed base units (millicores, MiB) so that "fits" and "never
//! over-committed" are exact comparisons, with no floating-point drift after millions of allocations
//! and releases. The wire form is whole units as JSON numbers (`cores`, `memory_gib`, `ssd_gib`).
//!
//! A new dimension is one new [`ResourceKind`] variant plus its entry in [`ResourceKind::ALL`].

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::ops::{Add, AddAssign};

/// Number of resource dimensions.
pub const RESOURCE_DIMS: usize = 3;

/// Largest amount of one dimension in whole units (a billion cores or GiB): far above any machine,
/// and far below the point where base units would overflow `u64`.
pub const MAX_WHOLE_UNITS: f64 = 1e9;

/// One dimension of a resource vector.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    Cores,
    MemoryGib,
    SsdGib,
}

impl ResourceKind {
    /// Every dimension, in the order of the vector.
    pub const ALL: [ResourceKind; RESOURCE_DIMS] = [ResourceKind::Cores, ResourceKind::MemoryGib, ResourceKind::SsdGib];

    /// Position of this dimension in a vector.
    pub const fn index(self) -> usize {
        match self {
            ResourceKind::Cores => 0,
            ResourceKind::MemoryGib => 1,
            ResourceKind::SsdGib => 2,
        }
    }

    /// Name of the dimension on the wire and in error messages.
    pub const fn field_name(self) -> &'static str {
        match self {
            ResourceKind::Cores => "cores",
            ResourceKind::MemoryGib => "memory_gib",
            ResourceKind::SsdGib => "ssd_gib",
        }
    }

    /// Base units per whole unit: millicores per core, MiB per GiB.
    pub const fn base_units_per_whole(self) -> u64 {
        match self {
            ResourceKind::Cores => 1000,
            ResourceKind::MemoryGib | ResourceKind::SsdGib => 1024,
        }
    }

    /// Whether a VM must demand a positive amount of this dimension (SSD is optional).
    pub const fn required_in_demand(self) -> bool {
        !matches!(self, ResourceKind::SsdGib)
    }
}

/// Why a whole-unit amount cannot become a resource amount.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AmountError {
    #[error("must be a finite number, got {0}")]
    NotFinite(f64),
    #[error("must not be negative, got {0}")]
    Negative(f64),
    #[error("must be at most {MAX_WHOLE_UNITS:e}, got {0}")]
    TooLarge(f64),
}

/// A vector of resource amounts in base units (see [`ResourceKind::base_units_per_whole`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    amounts: [u64; RESOURCE_DIMS],
}

impl Resources {
    pub const ZERO: Resources = Resources { amounts: [0; RESOURCE_DIMS] };

    /// Builds a vector from whole units. Fails on non-finite, negative or absurdly large amounts.
    ///
    /// Amounts round to the nearest base unit; a positive amount never rounds down to zero, so a
    /// tiny demand still occupies capacity.
    pub fn from_whole(cores: f64, memory_gib: f64, ssd_gib: f64) -> Result<Self, (ResourceKind, AmountError)> {
        let mut amounts = [0; RESOURCE_DIMS];
        for (kind, value) in ResourceKind::ALL.into_iter().zip([cores, memory_gib, ssd_gib]) {
            amounts[kind.index()] = whole_to_base(kind, value).map_err(|e| (kind, e))?;
        }
        Ok(Resources { amounts })
    }

    /// Builds a vector directly from base units (millicores, MiB, MiB).
    pub const fn from_base_units(amounts: [u64; RESOURCE_DIMS]) -> Self {
        Resources { amounts }
    }

    /// Amount of one dimension in base units.
    pub fn base(&self, kind: ResourceKind) -> u64 {
        self.amounts[kind.index()]
    }

    /// Amount of one dimension in whole units.
    pub fn whole(&self, kind: ResourceKind) -> f64 {
        self.amounts[kind.index()] as f64 / kind.base_units_per_whole() as f64
    }

    pub fn cores(&self) -> f64 {
        self.whole(ResourceKind::Cores)
    }

    pub fn memory_gib(&self) -> f64 {
        self.whole(ResourceKind::MemoryGib)
    }

    pub fn ssd_gib(&self) -> f64 {
        self.whole(ResourceKind::SsdGib)
    }

    pub fn base_units(&self) -> [u64; RESOURCE_DIMS] {
        self.amounts
    }

    pub fn is_zero(&self) -> bool {
        self.amounts.iter().all(|&a| a == 0)
    }

    /// True when `self` fits inside `available` in every dimension.
    pub fn fits_within(&self, available: &Resources) -> bool {
        self.amounts.iter().zip(&available.amounts).all(|(need, have)| need <= have)
    }

    /// `self - other`, or `None` when any dimension would go negative (an over-commit).
    pub fn checked_sub(&self, other: &Resources) -> Option<Resources> {
        let mut amounts = [0; RESOURCE_DIMS];
        for (i, slot) in amounts.iter_mut().enumerate() {
            *slot = self.amounts[i].checked_sub(other.amounts[i])?;
        }
        Some(Resources { amounts })
    }

    /// `self + other`, or `None` on overflow.
    pub fn checked_add(&self, other: &Resources) -> Option<Resources> {
        let mut amounts = [0; RESOURCE_DIMS];
        for (i, slot) in amounts.iter_mut().enumerate() {
            *slot = self.amounts[i].checked_add(other.amounts[i])?;
        }
        Some(Resources { amounts })
    }

    /// Share of `capacity` that `self` takes in each dimension (0 where the capacity is 0).
    pub fn shares_of(&self, capacity: &Resources) -> [f64; RESOURCE_DIMS] {
        let mut shares = [0.0; RESOURCE_DIMS];
        for (i, share) in shares.iter_mut().enumerate() {
            if capacity.amounts[i] > 0 {
                *share = self.amounts[i] as f64 / capacity.amounts[i] as f64;
            }
        }
        shares
    }
}

impl Add for Resources {
    type Output = Resources;

    /// Saturating, so that sums of demands used for statistics can never wrap.
    fn add(self, other: Resources) -> Resources {
        let mut amounts = self.amounts;
        for (slot, add) in amounts.iter_mut().zip(other.amounts) {
            *slot = slot.saturating_add(add);
        }
        Resources { amounts }
    }
}

impl AddAssign for Resources {
    fn add_assign(&mut self, other: Resources) {
        *self = *self + other;
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cores, {} GiB memory, {} GiB SSD", self.cores(), self.memory_gib(), self.ssd_gib())
    }
}

fn whole_to_base(kind: ResourceKind, value: f64) -> Result<u64, AmountError> {
    if !value.is_finite() {
        return Err(AmountError::NotFinite(value));
    }
    if value < 0.0 {
        return Err(AmountError::Negative(value));
    }
    if value > MAX_WHOLE_UNITS {
        return Err(AmountError::TooLarge(value));
    }
    let base = (value * kind.base_units_per_whole() as f64).round() as u64;
    Ok(if base == 0 && value > 0.0 { 1 } else { base })
}

/// Wire form: whole units, `ssd_gib` optional, nothing else accepted.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesWire {
    cores: WireAmount,
    memory_gib: WireAmount,
    #[serde(default)]
    ssd_gib: WireAmount,
}

/// One amount on the wire, checked while it is parsed so that a parse error points at its own field
/// (`demand.cores`), not at the whole vector.
#[derive(Copy, Clone, Default, Serialize)]
#[serde(transparent)]
struct WireAmount(f64);

impl<'de> Deserialize<'de> for WireAmount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(deserializer)?;
        // Any dimension's rules will do: the range checks are the same for all of them.
        whole_to_base(ResourceKind::Cores, value).map_err(serde::de::Error::custom)?;
        Ok(WireAmount(value))
    }
}

impl Serialize for Resources {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ResourcesWire {
            cores: WireAmount(self.cores()),
            memory_gib: WireAmount(self.memory_gib()),
            ssd_gib: WireAmount(self.ssd_gib()),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Resources {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = ResourcesWire::deserialize(deserializer)?;
        Resources::from_whole(wire.cores.0, wire.memory_gib.0, wire.ssd_gib.0)
            .map_err(|(kind, err)| serde::de::Error::custom(format!("`{}` {err}", kind.field_name())))
    }
}

/// OpenAPI schemas of the wire form: whole units, with the ranges [`Resources::from_whole`] accepts.
#[cfg(feature = "openapi")]
mod schema {
    use super::{Resources, MAX_WHOLE_UNITS};
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, Type};
    use utoipa::openapi::RefOr;

    fn amount(description: &str, exclusive_minimum: bool) -> ObjectBuilder {
        let amount = ObjectBuilder::new()
            .schema_type(Type::Number)
            .maximum(Some(MAX_WHOLE_UNITS))
            .description(Some(description));
        if exclusive_minimum {
            amount.exclusive_minimum(Some(0.0))
        } else {
            amount.minimum(Some(0.0))
        }
    }

    fn vector(description: &str, positive_demand: bool) -> ObjectBuilder {
        // `deny_unknown_fields` on the wire form: nothing but the three dimensions.
        let vector = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(description))
            .property("cores", amount("Cores (whole cores; 0.001 is one millicore).", positive_demand))
            .property("memory_gib", amount("Memory in GiB (1/1024 is one MiB).", positive_demand))
            .property("ssd_gib", amount("Local SSD in GiB; 0 when absent.", false))
            .required("cores")
            .required("memory_gib")
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)));
        if positive_demand {
            vector
        } else {
            vector.required("ssd_gib")
        }
    }

    /// A VM's demand as a client sends it: cores and memory greater than 0, SSD optional, each at
    /// most 1e9 (the checks of [`crate::validate`]).
    pub fn demand() -> Schema {
        vector("What the VM needs, in whole units.", true).into()
    }

    impl utoipa::PartialSchema for Resources {
        /// As the services answer it: all three dimensions, in whole units.
        fn schema() -> RefOr<Schema> {
            RefOr::T(vector("A resource vector in whole units.", false).into())
        }
    }

    impl utoipa::ToSchema for Resources {}
}

#[cfg(feature = "openapi")]
pub use schema::demand as demand_schema;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn whole_units_round_trip_through_base_units() {
        let r = Resources::from_whole(2.0, 1.75, 0.0).unwrap();
        assert_eq!(r.base_units(), [2000, 1792, 0]);
        assert_eq!((r.cores(), r.memory_gib(), r.ssd_gib()), (2.0, 1.75, 0.0));
    }

    #[test]
    fn tiny_positive_amounts_never_round_to_zero() {
        let r = Resources::from_whole(0.0001, 0.0001, 0.0).unwrap();
        assert_eq!(r.base_units(), [1, 1, 0]);
    }

    #[test]
    fn rejects_bad_amounts_naming_the_dimension() {
        assert!(matches!(
            Resources::from_whole(f64::NAN, 1.0, 0.0),
            Err((ResourceKind::Cores, AmountError::NotFinite(_)))
        ));
        assert!(matches!(
            Resources::from_whole(1.0, -1.0, 0.0),
            Err((ResourceKind::MemoryGib, AmountError::Negative(_)))
        ));
        assert!(matches!(
            Resources::from_whole(1.0, 1.0, 1e300),
            Err((ResourceKind::SsdGib, AmountError::TooLarge(_)))
        ));
    }

    #[test]
    fn json_wire_form_uses_whole_units_and_rejects_unknown_fields() {
        let r: Resources = serde_json::from_str(r#"{"cores": 4, "memory_gib": 16}"#).unwrap();
        assert_eq!(r, Resources::from_whole(4.0, 16.0, 0.0).unwrap());
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"cores":4.0,"memory_gib":16.0,"ssd_gib":0.0}"#);
        let err =
            serde_json::from_str::<Resources>(r#"{"cores": 4, "memory_gib": 16, "gpus": 1}"#).unwrap_err().to_string();
        assert!(err.contains("gpus"), "{err}");
    }

    proptest! {
        #[test]
        fn fits_within_agrees_with_checked_sub(a in proptest::array::uniform3(0u64..10_000),
                                               b in proptest::array::uniform3(0u64..10_000)) {
            let (a, b) = (Resources::from_base_units(a), Resources::from_base_units(b));
            prop_assert_eq!(a.fits_within(&b), b.checked_sub(&a).is_some());
            if let Some(rest) = b.checked_sub(&a) {
                prop_assert_eq!(rest.checked_add(&a), Some(b));
            }
        }
    }
}
