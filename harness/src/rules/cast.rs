//! A cast to a half precision of a value past its largest (65504 in f16)
//! is ±inf: a mask constant of −1e9, a large activation stored in f16.

use super::walk::{counted, num, values, Cx, Range};
use super::{decades, OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use candle_core::{DType, Tensor};

pub(super) struct Cast;

impl OpRule for Cast {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Cast]
    }

    fn id(&self) -> &'static str {
        "cast_overflow"
    }

    fn domain(&self) -> &'static str {
        "cast past the target's range"
    }

    /// Only a cast into a half precision narrows the range.
    fn risky(&self, dtype: DType) -> bool {
        super::half(dtype)
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        let Some(x) = v.read() else {
            return super::overflow_margin(v.output);
        };
        let r = Range::of(v.output.dtype());
        let hi = values(x)?.iter().fold(r.tiny, |m, x| m.max(x.abs()));
        Ok(Some(decades(r.max / hi)))
    }

    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        match v.read() {
            Some(x) => super::overflow_pressure(x),
            None => super::overflow_pressure(v.output),
        }
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        let Some(x) = cx.reads(i).first().copied() else {
            return Ok(None);
        };
        let (xs, out) = (values(x.tensor)?, values(cx.output(i))?);
        let r = Range::of(cx.output(i).dtype());
        if xs.len() != out.len() || !xs.iter().all(|v| v.is_finite()) {
            return Ok(None);
        }
        let over: Vec<f64> = xs
            .iter()
            .zip(&out)
            .filter(|(_, y)| y.is_infinite())
            .map(|(&v, _)| v)
            .collect();
        if over.is_empty() {
            return Ok(None);
        }
        let peak = over.iter().fold(0f64, |m, v| m.max(v.abs()));
        let constant = x.from.is_none()
            && !x.tensor.is_variable()
            && !cx.inputs.iter().any(|t| t.id() == x.tensor.id());
        let sentence = format!(
            "{} casts {} to {}, whose largest magnitude is {}: {} of them reach {} and become ±inf{}",
            cx.subject(i),
            cx.name(&x)?,
            r.name(),
            num(r.max),
            counted(over.len(), "value"),
            num(peak),
            if constant { " (a constant: the same on every step)" } else { "" }
        );
        cx.explained(
            i,
            Pattern::HalfCastOverflow,
            over.len(),
            Some(&x),
            sentence,
            format!(
                "keep the value inside {}'s range before the cast: a mask value of −1e4 (or the dtype's min), or clamp to ±{}",
                r.name(),
                num(r.max)
            ),
        )
        .map(Some)
    }
}
