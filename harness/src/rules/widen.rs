//! The repair of a value past a half dtype's range inside one function (a
//! sum of squares of deviations in the hundreds, in f16): the region of
//! the function from the op that overflowed to the first ops whose values
//! fit the dtype again, computed in f32 — what a developer writes by
//! casting up before that op and back where the values are small again.
//!
//! Each op of the region is computed again in f32 over the step's records
//! (the arithmetic the intervention runs, [`crate::intervention::widen`])
//! to find where the region ends: at each op whose f32 values fit the
//! dtype with room to spare ([`HEADROOM`]). A region that cannot close in
//! the function (a value past the range returned, passed to another
//! function, or read by an op that cannot be computed again) gives no
//! rewrite, and the explanation's words stand alone.

use super::walk::{values, Cx};
use crate::error::Result;
use crate::finding::{Rewrite, RewriteForm};
use crate::instrument::Operand;
use crate::intervention::widen::{recompute, widened_inputs};
use crate::spec::{dtype_max, HalfType};
use candle_core::Tensor;
use std::collections::HashMap;

/// How far inside the half dtype's range a value must be for the region
/// to end at it: the ops after it in half precision add to it, multiply
/// it by a few, before anything shrinks it again.
pub const HEADROOM: f64 = 16.0;

/// The region computed in f32 that repairs op `i`'s overflow: its entry,
/// with the ops after it (up to where it is cast back) as its `with`.
pub fn region(cx: &Cx, i: usize) -> Result<Option<Rewrite>> {
    let Some(site) = cx.site(i) else {
        return Ok(None);
    };
    let dtype = cx.output(i).dtype();
    let Some(half) = HalfType::of_dtype(dtype) else {
        return Ok(None);
    };
    // What the region's ops computed in f32, by record: the values still
    // past the range (those cast back are half precision again).
    let mut wide: HashMap<usize, Tensor> = HashMap::new();
    let mut members = Vec::new();
    let mut parts = Vec::new();
    for j in i..cx.g.records.len() {
        let Some(s) = cx.site(j).filter(|s| s.function == site.function) else {
            continue;
        };
        let inputs = &cx.g.records[j].inputs;
        let made_wide = |t: &Tensor| cx.g.made(t).filter(|k| wide.contains_key(k));
        if j != i && !Operand::tensors(inputs).any(|t| made_wide(t).is_some()) {
            continue;
        }
        let Some(cast) = cast_up(inputs, s.operands.len(), |t| {
            j != i && made_wide(t).is_some()
        }) else {
            return Ok(None);
        };
        let read = widened_inputs(inputs, |t| made_wide(t).and_then(|k| wide.get(&k)).cloned())?;
        let Ok(y) = recompute(s, &read, cx.output(j).dims()) else {
            return Ok(None);
        };
        let peak = values(&y)?.iter().fold(0f64, |m, v| m.max(v.abs()));
        if !peak.is_finite() {
            // f32 overflows too, or the op's NaN is not the range's.
            return Ok(None);
        }
        let back = (peak <= dtype_max(dtype) / HEADROOM).then_some(half);
        if back.is_none() {
            wide.insert(j, y);
        }
        members.push(j);
        parts.push(Rewrite {
            site: s.clone(),
            form: RewriteForm::Widened {
                cast,
                back,
                entry: j == i,
            },
            from: None,
            input: None,
            with: Vec::new(),
        });
    }
    // Every value kept in f32 is read, and only by the region's ops.
    let closed = wide.keys().all(|&k| {
        let readers = cx.g.consumers(k);
        !readers.is_empty() && readers.iter().all(|r| members.contains(r))
    });
    if !closed || parts.iter().any(|p| p.code().is_none()) {
        return Ok(None);
    }
    let mut parts = parts.into_iter();
    let Some(mut entry) = parts.next() else {
        return Ok(None);
    };
    entry.with = parts.collect();
    Ok(Some(entry))
}

/// Which operands of an op (bits, receiver first, over `texts` operand
/// texts) are half-precision tensors to cast up: those `in_region` does
/// not already hold in f32. `None` where the operands seen cannot be
/// placed among the texts (a list of tensors; fewer seen than written,
/// beyond the receiver alone).
fn cast_up(inputs: &[Operand], texts: usize, in_region: impl Fn(&Tensor) -> bool) -> Option<u8> {
    if (inputs.len() != texts && inputs.len() != 1) || texts > 8 {
        return None;
    }
    let mut cast = 0u8;
    for (k, o) in inputs.iter().enumerate() {
        match o {
            Operand::Tensor(t) if super::half(t.dtype()) && !in_region(t) => cast |= 1 << k,
            Operand::Tensors(_) => return None,
            _ => {}
        }
    }
    Some(cast)
}
