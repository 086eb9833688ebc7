//! JSON for floats that may be NaN or infinite: finite values stay numbers,
//! the others become the strings "NaN", "inf" and "-inf" (JSON has no
//! literal for them, and serde_json would write `null`). A scene's values
//! ([`exact`]) keep a NaN's bits too: `"NaN:fff8000000000000"` for any NaN
//! but the canonical one, so what a replay compares comes back as it was.

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

/// [`to_repr`], with a NaN's bits where they are not the canonical NaN's.
fn to_exact_repr(v: f64) -> Repr {
    if v.is_nan() && v.to_bits() != f64::NAN.to_bits() {
        Repr::Text(format!("NaN:{:016x}", v.to_bits()))
    } else {
        to_repr(v)
    }
}

fn from_repr<E: serde::de::Error>(r: Repr) -> Result<f64, E> {
    match r {
        Repr::Number(v) => Ok(v),
        Repr::Text(s) if s.starts_with("NaN:") => u64::from_str_radix(&s[4..], 16)
            .ok()
            .map(f64::from_bits)
            .filter(|v| v.is_nan())
            .ok_or_else(|| E::custom(format!("expected a NaN's 16 hex digits, got {s:?}"))),
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

/// A scene's values: NaN payloads and signs kept (read by either form).
pub mod exact {
    use super::*;
    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| to_exact_repr(*x)))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        super::vec::deserialize(d)
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

    #[derive(serde::Serialize, serde::Deserialize, Debug)]
    struct Exact {
        #[serde(with = "super::exact")]
        v: Vec<f64>,
    }

    #[test]
    fn a_scenes_nan_keeps_its_sign_and_payload() {
        // inf − inf on x86 is the quiet NaN with its sign bit set.
        let negative = f64::from_bits(0xfff8_0000_0000_0000);
        let payload = f64::from_bits(0x7ff0_0000_0000_0001);
        let t = Exact {
            v: vec![f64::NAN, negative, payload, 2.0],
        };
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            json,
            r#"{"v":["NaN","NaN:fff8000000000000","NaN:7ff0000000000001",2.0]}"#
        );
        let back: Exact = serde_json::from_str(&json).unwrap();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.v), bits(&t.v));
        // Not a NaN's bits: refused, naming what it read.
        let bad = serde_json::from_str::<Exact>(r#"{"v":["NaN:3ff0000000000000"]}"#);
        assert!(bad.unwrap_err().to_string().contains("NaN's 16 hex digits"));
    }
}
