//! a / b: 0/0 is NaN, x/0 is ±inf, and a quotient by a tiny value can pass
//! the range. A zero denominator is explained by what made it: a norm or
//! an RMS of a row of zeros (x/‖x‖), a standard deviation of a constant
//! column (a batch norm by hand without eps), a ReLU, the same tensor
//! shifted by one (x[i+1]/x[i] of an underflowed cumulative product).

use super::walk::{counted, num, values, Arg, Cx, Range, ZeroCause};
use super::{overflow_margin, OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use crate::models::graph::Read;
use candle_core::{DType, Tensor};

pub(super) struct Div;

impl OpRule for Div {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Div]
    }

    fn id(&self) -> &'static str {
        "division"
    }

    fn domain(&self) -> &'static str {
        "denominator at 0"
    }

    fn at_zero(&self) -> bool {
        true
    }

    /// The least of the denominator's distance from 0 (as the decades
    /// between its smallest magnitude and the smallest positive value) and
    /// the quotient's from the range's end.
    fn margin(&self, v: &View) -> Result<Option<f64>> {
        let over = overflow_margin(v.output)?;
        let Some(den) = denominator(v) else {
            return Ok(over);
        };
        let tiny = Range::of(den.dtype()).tiny;
        let lo = values(den)?
            .iter()
            .fold(f64::INFINITY, |m, x| m.min(x.abs()));
        let near = super::decades(lo.max(tiny) / tiny);
        Ok(Some(over.map_or(near, |o| o.min(near))))
    }

    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        match denominator(v) {
            Some(den) => Ok(Some(
                den.to_dtype(DType::F32)?
                    .flatten_all()?
                    .abs()?
                    .min(0)?
                    .neg()?,
            )),
            None => super::overflow_pressure(v.output),
        }
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        let args = cx.args(i);
        let recip = cx.site(i).is_some_and(|s| s.op == "recip");
        let (num_arg, den_arg) = match (recip, args.as_slice()) {
            (true, [x]) => (Arg::Scalar(1.0), *x),
            (false, [a, b]) => (*a, *b),
            _ => return Ok(None),
        };
        let out_t = cx.output(i);
        let out = values(out_t)?;
        let (Some(a), Some(b)) = (
            cx.arg_values(&num_arg, out_t)?,
            cx.arg_values(&den_arg, out_t)?,
        ) else {
            return Ok(None);
        };
        if !a.iter().chain(&b).all(|v| v.is_finite()) {
            return Ok(None);
        }
        let nan = out.iter().filter(|v| v.is_nan()).count();
        let inf = out.iter().filter(|v| v.is_infinite()).count();
        let both_zero: Vec<bool> = (0..out.len())
            .map(|k| out[k].is_nan() && a[k] == 0.0 && b[k] == 0.0)
            .collect();
        let zero_over = both_zero.iter().filter(|&&z| z).count();
        let by_zero: Vec<bool> = (0..out.len())
            .map(|k| out[k].is_infinite() && b[k] == 0.0)
            .collect();
        let x_over = by_zero.iter().filter(|&&z| z).count();
        let subject = cx.subject(i);
        let den_name = cx.arg_name(&den_arg)?;
        let den_text = denominator_text(cx, i);
        let eps_repair = match &den_text {
            Some(d) => format!("add an eps to the denominator: `({d} + 1e-8)?` for `{d}` (or clamp it to at least an eps)"),
            None => "add an eps to the denominator, or clamp it to at least an eps".into(),
        };
        if zero_over > 0 && zero_over == nan && x_over == inf {
            if let Some(e) = shifted_ratio(cx, i, &num_arg, &den_arg, zero_over)? {
                return Ok(Some(e));
            }
            let zero_at: Vec<bool> = b.iter().map(|&v| v == 0.0).collect();
            let why = match den_arg {
                Arg::Tensor(r) => cx.why_zero(&r, &zero_at)?,
                Arg::Scalar(_) => None,
            };
            let rows = zero_rows_of(out_t, &both_zero);
            let (pattern, count, repair) = match why.as_ref().map(|z| z.cause) {
                Some(ZeroCause::ZeroRows) => (Pattern::ZeroNormRow, rows, eps_repair.clone()),
                Some(ZeroCause::Constant) => (
                    Pattern::ConstantNormalized,
                    zero_over,
                    "add an eps under the root: (x − mean) / sqrt(var + eps)".into(),
                ),
                _ => (Pattern::ZeroOverZero, zero_over, eps_repair.clone()),
            };
            let what = if pattern == Pattern::ZeroNormRow {
                counted(rows, "row")
            } else {
                counted(zero_over, "value")
            };
            let mut sentence = format!(
                "{subject} divides by {den_name}, which is exactly 0 where the numerator is 0 too, in {what}: 0/0 = NaN{}",
                zero_eps(cx, &den_arg)?
            );
            if let Some(z) = why {
                sentence.push_str(&format!("; {}", z.why));
            }
            let read = arg_read(&den_arg);
            return cx
                .explained(i, pattern, count, read.as_ref(), sentence, repair)
                .map(Some);
        }
        if inf > 0 && nan == 0 {
            // x/0, or x over a value so small the quotient overflows.
            let r = Range::of(out_t.dtype());
            let at: Vec<bool> = out.iter().map(|y| y.is_infinite()).collect();
            let small = b
                .iter()
                .zip(&at)
                .filter(|(_, &bad)| bad)
                .fold(0f64, |m, (v, _)| m.max(v.abs()));
            let why = match den_arg {
                Arg::Tensor(r) => cx.why_zero(&r, &at)?,
                Arg::Scalar(_) => None,
            };
            let size = if x_over == inf {
                "exactly 0 there".to_string()
            } else {
                format!(
                    "exactly 0 in {} of them and at most {} in magnitude in all, where the quotient passes {}'s largest value {}",
                    x_over,
                    num(small),
                    r.name(),
                    num(r.max)
                )
            };
            let mut sentence = format!(
                "{subject} divides {} of {} by {den_name}, which is {size}: ±inf",
                counted(inf, "value"),
                cx.arg_name(&num_arg)?
            );
            if let Some(z) = why {
                sentence.push_str(&format!("; {}", z.why));
            }
            let read = arg_read(&den_arg);
            return cx
                .explained(
                    i,
                    Pattern::DivisionByZero,
                    inf,
                    read.as_ref(),
                    sentence,
                    eps_repair,
                )
                .map(Some);
        }
        Ok(None)
    }
}

/// ", and its eps is 0" when the denominator adds an eps of exactly 0.
fn zero_eps(cx: &Cx, den: &Arg) -> Result<String> {
    let Arg::Tensor(r) = den else {
        return Ok(String::new());
    };
    let Some(j) = cx.maker(r)? else {
        return Ok(String::new());
    };
    let adds_zero =
        matches!(cx.kind(j), Some(OpKind::Add)) && cx.g.scalars(j) == [0.0] && cx.site(j).is_some();
    Ok(match adds_zero {
        true => " (the eps it adds is 0)".into(),
        false => String::new(),
    })
}

/// The denominator of a division as the hunt sees it: the second tensor
/// read, or the only one of a reciprocal (no number read).
fn denominator<'a>(v: &View<'a>) -> Option<&'a Tensor> {
    match (v.reads.as_slice(), v.scalars.is_empty()) {
        ([_, b], _) => Some(b),
        ([x], true) => Some(x),
        _ => None,
    }
}

fn arg_read<'r>(a: &Arg<'r>) -> Option<Read<'r>> {
    match a {
        Arg::Tensor(r) => Some(*r),
        Arg::Scalar(_) => None,
    }
}

/// The denominator as written in the op's text, where it can be read off
/// (`a.broadcast_div(&norm)` → `norm`, `(a / b)` → `b`).
fn denominator_text(cx: &Cx, i: usize) -> Option<String> {
    let s = cx.site(i)?;
    if let Some(open) = s.text.rfind(&format!(".{}(", s.op)) {
        let inner = &s.text[open + s.op.len() + 2..];
        let inner = inner.strip_suffix(')')?;
        return Some(inner.trim_start_matches('&').to_string());
    }
    let (_, b) = s.text.rsplit_once(" / ")?;
    Some(b.trim_start_matches('&').to_string())
}

/// How many rows (the last dimension) of `out` hold a flagged position.
fn zero_rows_of(out: &Tensor, flagged: &[bool]) -> usize {
    let width = (*out.dims().last().unwrap_or(&1)).max(1);
    flagged
        .chunks(width)
        .filter(|r| r.iter().any(|&f| f))
        .count()
}

/// x[i+1] / x[i] along a dimension: numerator and denominator are slices
/// of one tensor shifted by one, which holds exact zeros.
fn shifted_ratio(cx: &Cx, i: usize, a: &Arg, b: &Arg, n: usize) -> Result<Option<Explanation>> {
    let (Arg::Tensor(a), Arg::Tensor(b)) = (a, b) else {
        return Ok(None);
    };
    let source = |r: &Read| -> Result<Option<Read>> {
        let Some(j) = cx.maker(r)? else {
            return Ok(None);
        };
        if cx.kind(j) != Some(OpKind::View) || cx.site(j).is_none_or(|s| s.op != "narrow") {
            return Ok(None);
        }
        Ok(cx.reads(j).first().copied())
    };
    let (Some(sa), Some(sb)) = (source(a)?, source(b)?) else {
        return Ok(None);
    };
    if sa.tensor.id() != sb.tensor.id() {
        return Ok(None);
    }
    let t = values(sa.tensor)?;
    let zeros = t.iter().filter(|&&v| v == 0.0).count();
    let sentence = format!(
        "{} divides {} by itself shifted by one (x[i+1] / x[i]): {} of its {} values are exactly 0 (a cumulative product that underflowed, say), so {} of the ratios are 0/0",
        cx.subject(i),
        cx.name(&sa)?,
        zeros,
        t.len(),
        n
    );
    cx.explained(
        i,
        Pattern::ShiftedRatio,
        n,
        Some(&sa),
        sentence,
        "compute the ratio in log space (a difference of cumulative sums of logs), use the factor itself (the ratio of consecutive cumulative products is the next factor), or add an eps to the denominator".into(),
    )
    .map(Some)
}
