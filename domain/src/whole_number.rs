//! Counts on the wire: a JSON number that is a whole number, written `2` or `2.0`.
//!
//! JSON has one number type, and JSON Schema's `integer` (what the OpenAPI documents say of these
//! fields) is any number without a fractional part, so `2.0` is the integer 2. serde's integer
//! types accept only the `2` spelling; these deserializers accept both, and still refuse a
//! fraction, a negative number or one out of the type's range.
//!
//! `#[serde(deserialize_with = "domain::whole_number::deserialize")]` on a count, and
//! `#[serde(default, deserialize_with = "domain::whole_number::option")]` on an optional one.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// Largest whole number a JSON float spells exactly (2^53).
const EXACT_FLOAT_LIMIT: f64 = 9_007_199_254_740_992.0;

struct WholeNumber<T>(PhantomData<T>);

impl<T: TryFrom<u64>> WholeNumber<T> {
    fn fit<E: de::Error>(value: u64) -> Result<T, E> {
        T::try_from(value).map_err(|_| E::custom(format!("{value} is out of range")))
    }
}

impl<'de, T: TryFrom<u64>> Visitor<'de> for WholeNumber<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a whole number")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<T, E> {
        Self::fit(value)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<T, E> {
        let value = u64::try_from(value).map_err(|_| E::custom(format!("must not be negative, got {value}")))?;
        Self::fit(value)
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<T, E> {
        if value.fract() != 0.0 || !value.is_finite() {
            return Err(E::custom(format!("must be a whole number, got {value}")));
        }
        if value < 0.0 {
            return Err(E::custom(format!("must not be negative, got {value}")));
        }
        if value > EXACT_FLOAT_LIMIT {
            return Err(E::custom(format!("{value} is out of range")));
        }
        // Whole, non-negative and at most 2^53: the conversion is exact.
        Self::fit(value as u64)
    }
}

/// A whole number into `T` (`u32`, `usize`, ...).
pub fn deserialize<'de, D: Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_any(WholeNumber(PhantomData))
}

/// An optional whole number: `null` is `None` (with `#[serde(default)]`, so is a missing field).
pub fn option<'de, D: Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<Option<T>, D::Error> {
    struct OptionalWholeNumber<T>(PhantomData<T>);

    impl<'de, T: TryFrom<u64>> Visitor<'de> for OptionalWholeNumber<T> {
        type Value = Option<T>;

        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            formatter.write_str("a whole number or null")
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
            deserialize(deserializer).map(Some)
        }
    }

    deserializer.deserialize_option(OptionalWholeNumber(PhantomData))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct Counts {
        #[serde(deserialize_with = "super::deserialize")]
        count: u32,
        #[serde(default, deserialize_with = "super::option")]
        limit: Option<usize>,
    }

    fn parse(json: &str) -> Result<Counts, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn whole_numbers_are_read_in_either_spelling() {
        let counts = parse(r#"{"count": 2.0, "limit": 7}"#).unwrap();
        assert_eq!((counts.count, counts.limit), (2, Some(7)));
        assert_eq!(parse(r#"{"count": 2, "limit": 7.0}"#).unwrap().limit, Some(7));
        assert_eq!(parse(r#"{"count": 0, "limit": null}"#).unwrap().limit, None);
        assert_eq!(parse(r#"{"count": 0}"#).unwrap().limit, None);
    }

    #[test]
    fn fractions_negatives_and_overflows_are_refused() {
        for json in [
            r#"{"count": 2.5}"#,
            r#"{"count": -1}"#,
            r#"{"count": -1.0}"#,
            r#"{"count": 4294967296}"#,
            r#"{"count": 1e300}"#,
            r#"{"count": "2"}"#,
            r#"{"count": 1, "limit": 0.5}"#,
        ] {
            assert!(parse(json).is_err(), "{json} was accepted");
        }
    }
}
