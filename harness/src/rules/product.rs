//! a · b: an exact 0 times an infinity is NaN (0·(−inf) where the −inf
//! came in from elsewhere: a constant, a mask), and in half precision a
//! product of values inside the range can pass it.

use super::walk::{counted, num, values, Arg, Cx, Range};
use super::OpRule;
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use candle_core::DType;

pub(super) struct Product;

impl OpRule for Product {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Mul]
    }

    fn id(&self) -> &'static str {
        "product"
    }

    fn domain(&self) -> &'static str {
        "product past the range"
    }

    fn risky(&self, dtype: DType) -> bool {
        super::half(dtype)
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        let args = cx.args(i);
        let out_t = cx.output(i);
        let out = values(out_t)?;
        let mut vals = Vec::new();
        for a in &args {
            match cx.arg_values(a, out_t)? {
                Some(v) => vals.push(v),
                None => return Ok(None),
            }
        }
        if vals.is_empty() {
            return Ok(None);
        }
        // 0 · ±inf: NaN where one factor is 0 and another infinite.
        let zero_inf =
            |k: usize| vals.iter().any(|v| v[k] == 0.0) && vals.iter().any(|v| v[k].is_infinite());
        let nan = out.iter().filter(|v| v.is_nan()).count();
        let n = (0..out.len())
            .filter(|&k| out[k].is_nan() && zero_inf(k))
            .count();
        if n > 0 && n == nan {
            let inf_arg = args
                .iter()
                .zip(&vals)
                .find(|(_, v)| v.iter().any(|x| x.is_infinite()))
                .map(|(a, _)| *a);
            let zero_arg = args
                .iter()
                .zip(&vals)
                .find(|(_, v)| v.contains(&0.0))
                .map(|(a, _)| *a);
            let (Some(inf_arg), Some(zero_arg)) = (inf_arg, zero_arg) else {
                return Ok(None);
            };
            let sentence = format!(
                "{} multiplies {} (±inf in places) by {}, which is exactly 0 in {} of those places: 0·inf = NaN",
                cx.subject(i),
                cx.arg_name(&inf_arg)?,
                cx.arg_name(&zero_arg)?,
                counted(n, "value")
            );
            let read = match inf_arg {
                Arg::Tensor(r) => Some(r),
                Arg::Scalar(_) => None,
            };
            return cx
                .explained(
                    i,
                    Pattern::ZeroTimesInfinity,
                    n,
                    read.as_ref(),
                    sentence,
                    "keep the infinite factor finite (a finite mask value, a clamp), or select instead of multiplying: where(mask, x, 0)".into(),
                )
                .map(Some);
        }
        overflowed(cx, i, &vals, "multiplies", "a product")
    }
}

/// ±inf (no NaN) made from finite operands: the op passed the range.
pub(super) fn overflowed(
    cx: &Cx,
    i: usize,
    operands: &[Vec<f64>],
    verb: &str,
    what: &str,
) -> Result<Option<Explanation>> {
    let out = values(cx.output(i))?;
    if out.iter().any(|v| v.is_nan())
        || !out.iter().any(|v| v.is_infinite())
        || !operands.iter().flatten().all(|v| v.is_finite())
    {
        return Ok(None);
    }
    let r = Range::of(cx.output(i).dtype());
    let inf = out.iter().filter(|v| v.is_infinite()).count();
    let peak = operands.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    let sentence = format!(
        "{} {verb} values up to {} (inside the range) into {what} past {}'s largest value {} in {}",
        cx.subject(i),
        num(peak),
        r.name(),
        num(r.max),
        counted(inf, "value")
    );
    let read = cx.reads(i).first().copied();
    cx.explained(
        i,
        Pattern::AccumulationOverflow,
        inf,
        read.as_ref(),
        sentence,
        "scale before it (q·k / sqrt(d) for attention scores, a mean instead of a sum), or compute it in f32".into(),
    )
    .map(Some)
}
