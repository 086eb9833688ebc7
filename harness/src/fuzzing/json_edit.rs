//! Structure-aware inputs for the `case_json` target. Random bytes almost
//! never parse as a case, so the parser's validation was barely reached;
//! here the bytes choose a valid base case (each built-in family, and a
//! custom model) and a few edits at paths of its JSON tree: a field set to
//! a boundary number (0, 2^16, 2^32, 2^64-1, -1, 1e-300, 1e308), a number
//! scaled, a string swapped for another the same field takes, an array
//! grown or emptied; now and then a field removed, an unknown one added or
//! a value of another type. Most results still parse as a
//! case, so the fuzzer spends its time in `validate` and the round trip.

use crate::spec::{Case, CustomSpec, InitSpec, InputSpec, ModelSpec, FAMILIES};
use crate::strategy::{generate, StrategyOptions};
use arbitrary::{Result, Unstructured};
use serde_json::{Map, Number, Value};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Boundary integers: where sizes overflow and ranges end.
const INTEGERS: [u64; 12] = [
    0,
    1,
    2,
    3,
    255,
    4096,
    65_536,
    1 << 24,
    1 << 32,
    1 << 53,
    1 << 63,
    u64::MAX,
];

/// Boundary floats: zero, tiny, negative, huge, and the largest finite.
const FLOATS: [f64; 10] = [0.0, -1.0, 1.0, 0.5, 1e-12, 1e-300, 1e6, 1e30, 1e308, -1e308];

/// The base cases an input edits (each built-in family, a custom model,
/// and cases the campaign strategy draws, with pathologies and
/// augmentations), and per field name the strings it takes in them: a
/// string edit picks one of those, so that it usually still parses.
struct Bases {
    cases: Vec<Value>,
    strings: BTreeMap<String, Vec<String>>,
    /// Per field, the objects it holds in the bases: a tag edit (`kind`,
    /// `family`) swaps the whole object for one with another tag.
    objects: BTreeMap<String, Vec<Value>>,
}

fn bases() -> &'static Bases {
    static BASES: OnceLock<Bases> = OnceLock::new();
    BASES.get_or_init(|| {
        let mut cases: Vec<Case> = FAMILIES
            .iter()
            .map(|f| Case::example(f).expect("built-in family"))
            .collect();
        let mut custom = Case::example("cnn").expect("built-in family");
        custom.model = ModelSpec::Custom(CustomSpec {
            name: "user_model".into(),
            input: InputSpec::Image {
                channels: 3,
                height: 8,
                width: 8,
            },
            outputs: 4,
            init: InitSpec::default(),
            per_token: false,
            frozen: Vec::new(),
            knobs: Default::default(),
            init_overrides: Default::default(),
        });
        cases.push(custom);
        cases.extend((0..12).map(|seed| generate(&StrategyOptions::default(), seed)));
        let cases: Vec<Value> = cases
            .iter()
            .map(|c| serde_json::to_value(c).expect("a case serializes"))
            .collect();
        let mut bases = Bases {
            cases: Vec::new(),
            strings: BTreeMap::new(),
            objects: BTreeMap::new(),
        };
        for case in &cases {
            bases.collect(case, &mut Vec::new());
        }
        bases.cases = cases;
        bases
    })
}

impl Bases {
    /// Strings and objects are keyed by their field and its parent's
    /// (`loss.kind`, `optimizer.kind`): one name means different things in
    /// different places.
    fn collect(&mut self, value: &Value, here: &mut Vec<Step>) {
        let add = |seen: &mut Vec<Value>, v: &Value| {
            if !seen.contains(v) {
                seen.push(v.clone());
            }
        };
        match value {
            Value::String(s) => {
                let seen = self.strings.entry(field_key(here)).or_default();
                if !seen.contains(s) {
                    seen.push(s.clone());
                }
            }
            Value::Object(m) => {
                add(self.objects.entry(field_key(here)).or_default(), value);
                for (k, v) in m {
                    here.push(Step::Key(k.clone()));
                    self.collect(v, here);
                    here.pop();
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    here.push(Step::Index(i));
                    self.collect(v, here);
                    here.pop();
                }
            }
            _ => {}
        }
    }
}

/// The last two keys of a path (indices skipped), as `parent.field`.
fn field_key(path: &[Step]) -> String {
    let keys: Vec<&str> = path
        .iter()
        .filter_map(|s| match s {
            Step::Key(k) => Some(k.as_str()),
            Step::Index(_) => None,
        })
        .collect();
    keys[keys.len().saturating_sub(2)..].join(".")
}

/// The JSON text an input stands for: a base case with up to four edits.
pub fn case_text(u: &mut Unstructured) -> Result<String> {
    let bases = bases();
    let mut value = bases.cases[u.choose_index(bases.cases.len())?].clone();
    let edits = u.int_in_range(1..=4)?;
    for _ in 0..edits {
        if u.is_empty() {
            break;
        }
        edit(&mut value, bases, u)?;
    }
    Ok(value.to_string())
}

/// Every path from the root to a value that is not an object, as keys and indices.
fn paths(value: &Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    if !value.is_object() {
        out.push(here.clone());
    }
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                here.push(Step::Key(k.clone()));
                paths(v, here, out);
                here.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                here.push(Step::Index(i));
                paths(v, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

fn at<'a>(value: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(value, |v, step| match (step, v) {
        (Step::Key(k), Value::Object(m)) => m.get_mut(k).expect("a path found in the tree"),
        (Step::Index(i), Value::Array(a)) => &mut a[*i],
        _ => unreachable!("paths follow the tree"),
    })
}

fn float(x: f64) -> Value {
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}

fn edit(root: &mut Value, bases: &Bases, u: &mut Unstructured) -> Result<()> {
    let mut all = Vec::new();
    paths(root, &mut Vec::new(), &mut all);
    let path = all[u.choose_index(all.len())?].clone();
    let target = at(root, &path);
    // Mostly edits that keep the value's type, so that the result still
    // parses and validation decides; now and then one that breaks the format.
    let tag = matches!(path.last(), Some(Step::Key(k)) if k == "kind" || k == "family");
    match (u.int_in_range(0u8..=29)?, &*target) {
        (0..=25, Value::String(_)) if tag => {
            let parent = &path[..path.len() - 1];
            if let Some(objects) = bases.objects.get(&field_key(parent)) {
                *at(root, parent) = u.choose(objects)?.clone();
            }
        }
        (0..=23, Value::Number(n)) if n.is_u64() => {
            let x = n.as_u64().expect("checked");
            *target = Value::Number(Number::from(match u.int_in_range(0u8..=3)? {
                0 => x.saturating_mul(2),
                1 => x / 2,
                2 => x.saturating_add(1),
                _ => *u.choose(&INTEGERS)?,
            }));
        }
        (0..=23, Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(1.0);
            *target = float(match u.int_in_range(0u8..=3)? {
                0 => x * 10.0,
                1 => x / 10.0,
                2 => -x,
                _ => *u.choose(&FLOATS)?,
            });
        }
        (0..=23, Value::Bool(b)) => *target = Value::Bool(!b),
        (0..=25, Value::String(_)) => {
            if let Some(names) = bases.strings.get(&field_key(&path)) {
                *target = Value::String(u.choose(names)?.clone());
            }
        }
        (0..=25, Value::Array(items)) => {
            let mut items = items.clone();
            match items.first().cloned() {
                Some(first) if u.arbitrary()? => items.push(first),
                _ => items.clear(),
            }
            *target = Value::Array(items);
        }
        (0..=26, _) => *target = Value::String("f16".into()),
        (27 | 28, _) => {
            if let Some((last, parent)) = path.split_last() {
                if let (Value::Object(m), Step::Key(k)) = (at(root, parent), last) {
                    if u.arbitrary()? {
                        m.remove(k);
                    } else {
                        m.insert("unknown_field".into(), Value::Bool(true));
                    }
                }
            }
        }
        _ => {
            *target = match u.int_in_range(0u8..=2)? {
                0 => Value::Null,
                1 => Value::Bool(u.arbitrary()?),
                _ => Value::Object(Map::new()),
            }
        }
    }
    Ok(())
}
