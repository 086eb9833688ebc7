//! JSON for floats that may be NaN or infinite: finite values stay numbers,
//! the others become the strings "NaN", "inf" and "-inf" (JSON has no
//! literal for them, and serde_json would write `null`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Repr {
    Number(f64),
    Text(String),
}

fn to_repr(v: f64) -> Repr {
    if v.is_finite() {
        Repr::Number(v)
    } else if v.is_nan() {
        Repr::Text("NaN".into())
    } else if v > 0.0 {
        Repr::Text("inf".into())
    } else {
        Repr::Text("-inf".into())
    }
}

fn from_repr<E: serde::de::Error>(r: Repr) -> Result<f64, E> {
    match r {
        Repr::Number(v) => Ok(v),
        Repr::Text(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            other => Err(E::custom(format!(
                "expected a number, \"NaN\", \"inf\" or \"-inf\", got {other:?}"
            ))),
        },
    }
}

pub mod one {
    use super::*;
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        to_repr(*v).serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        from_repr(Repr::deserialize(d)?)
    }
}

pub mod vec {
    use super::*;
    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| to_repr(*x)))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<Repr>::deserialize(d)?
            .into_iter()
            .map(from_repr)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize, Debug)]
    struct T {
        #[serde(with = "super::vec")]
        v: Vec<f64>,
    }

    #[test]
    fn non_finite_values_round_trip() {
        let t = T {
            v: vec![1.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
        };
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#"{"v":[1.5,"NaN","inf","-inf"]}"#);
        let back: T = serde_json::from_str(&json).unwrap();
        assert_eq!(back.v[0], 1.5);
        assert!(back.v[1].is_nan());
        assert_eq!(back.v[2], f64::INFINITY);
        assert_eq!(back.v[3], f64::NEG_INFINITY);
    }
}
