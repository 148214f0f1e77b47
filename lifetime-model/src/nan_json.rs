//! JSON has no NaN: these serde helpers write NaN as `null` and read `null` back as NaN, for the
//! manifest's feature rows (missing values are NaN) and metrics that can be undefined.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    if value.is_finite() {
        serializer.serialize_f64(*value)
    } else {
        serializer.serialize_none()
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

pub mod vec {
    use super::*;

    pub fn serialize<S: Serializer>(values: &[f64], serializer: S) -> Result<S::Ok, S::Error> {
        values.iter().map(|v| v.is_finite().then_some(*v)).collect::<Vec<_>>().serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<f64>, D::Error> {
        Ok(Vec::<Option<f64>>::deserialize(deserializer)?.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect())
    }
}

pub mod pairs {
    use super::*;

    pub fn serialize<S: Serializer>(values: &[(f64, f64)], serializer: S) -> Result<S::Ok, S::Error> {
        let finite = |v: f64| v.is_finite().then_some(v);
        values.iter().map(|&(a, b)| (finite(a), finite(b))).collect::<Vec<_>>().serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<(f64, f64)>, D::Error> {
        let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
        Ok(Vec::<(Option<f64>, Option<f64>)>::deserialize(deserializer)?
            .into_iter()
            .map(|(a, b)| (nan(a), nan(b)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Row {
        #[serde(with = "super")]
        x: f64,
        #[serde(with = "super::vec")]
        v: Vec<f64>,
    }

    #[test]
    fn nan_round_trips_as_null() {
        let json = serde_json::to_string(&Row { x: f64::NAN, v: vec![1.0, f64::NAN] }).unwrap();
        assert_eq!(json, r#"{"x":null,"v":[1.0,null]}"#);
        let back: Row = serde_json::from_str(&json).unwrap();
        assert!(back.x.is_nan() && back.v[0] == 1.0 && back.v[1].is_nan());
    }
}
