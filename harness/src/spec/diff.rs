//! Field-level differences between two cases (for fixes and minimization).

use super::Case;
use serde::Serialize;
use serde_json::Value;

/// One changed field of a case.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldChange {
    /// The field's JSON path (`optimizer.lr`).
    pub path: String,
    /// Its value before.
    pub before: Value,
    /// Its value after.
    pub after: Value,
}

/// Fields that differ between two cases, as JSON paths.
pub fn case_diff(before: &Case, after: &Case) -> Vec<FieldChange> {
    let (a, b) = (
        serde_json::to_value(before).expect("cases serialize"),
        serde_json::to_value(after).expect("cases serialize"),
    );
    let mut out = Vec::new();
    diff_values("", &a, &b, &mut out);
    out
}

fn diff_values(path: &str, a: &Value, b: &Value, out: &mut Vec<FieldChange>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y))
            if x.get("kind") == y.get("kind") && x.get("family") == y.get("family") =>
        {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff_values(
                    &p,
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                diff_values(&format!("{path}[{i}]"), u, v, out);
            }
        }
        _ if a != b => out.push(FieldChange {
            path: path.to_string(),
            before: a.clone(),
            after: b.clone(),
        }),
        _ => {}
    }
}
