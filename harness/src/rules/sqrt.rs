//! sqrt(x): NaN below 0, and an infinite slope at exactly 0, so its
//! backward pass turns a finite gradient into ±inf or NaN there. The zeros
//! are explained by what made them: a ReLU (sqrt(relu(h))), a sum or a
//! mean of squares of a row of zeros (a norm, sqrt(a² + b²) at the origin).

use super::walk::{counted, num, values, Cx, Range, ZeroCause};
use super::{decades, OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use crate::models::graph::Read;
use candle_core::{DType, Tensor};

pub(super) struct Sqrt;

impl OpRule for Sqrt {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Sqrt]
    }

    fn id(&self) -> &'static str {
        "root_at_zero"
    }

    fn domain(&self) -> &'static str {
        "root at 0"
    }

    fn at_zero(&self) -> bool {
        true
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        root_margin(v.output)
    }

    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        Ok(Some(
            v.output
                .to_dtype(DType::F32)?
                .flatten_all()?
                .min(0)?
                .neg()?,
        ))
    }

    /// NaN from a root is a root of negatives.
    fn stage_pattern(&self, _: OpKind, out: &[f64]) -> Option<Pattern> {
        out.iter()
            .any(|v| v.is_nan())
            .then_some(Pattern::NegativeDomain)
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        negative(cx, i, "square root")
    }

    fn backward(&self, cx: &Cx, i: usize, k: usize, grad: &Tensor) -> Result<Option<Explanation>> {
        slope_at_zero(cx, i, k, grad, "square root")
    }
}

/// The margin of a root: decades between min(y)² and the smallest positive
/// value (0 when an output is not finite or exactly 0 ... reached).
pub(super) fn root_margin(y: &Tensor) -> Result<Option<f64>> {
    let v = values(y)?;
    if v.iter().any(|x| !x.is_finite()) {
        return Ok(Some(0.0));
    }
    let tiny = Range::of(y.dtype()).tiny;
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(Some(decades((lo * lo).max(tiny) / tiny)))
}

/// A root (or a fractional power) of negative values: NaN.
pub(super) fn negative(cx: &Cx, i: usize, what: &str) -> Result<Option<Explanation>> {
    let Some(x) = cx.reads(i).first().copied() else {
        return Ok(None);
    };
    let (xs, out) = (values(x.tensor)?, values(cx.output(i))?);
    if xs.len() != out.len() {
        return Ok(None);
    }
    let n = xs
        .iter()
        .zip(&out)
        .filter(|&(&a, b)| a < 0.0 && b.is_nan())
        .count();
    let nan = out.iter().filter(|v| v.is_nan()).count();
    if n == 0 || n != nan {
        return Ok(None);
    }
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    cx.explained(
        i,
        Pattern::NegativeDomain,
        n,
        Some(&x),
        format!(
            "{} takes the {what} of {} of {} that {} negative (down to {}): NaN{}",
            cx.subject(i),
            counted(n, "value"),
            cx.name(&x)?,
            super::walk::are(n),
            num(lo),
            cancellation(cx, &x)?
        ),
        "make what it reads non-negative by construction (a square, softplus, relu plus an eps), or clamp it: `x.maximum(0.0)?`".into(),
    )
    .map(Some)
}

/// Why a difference can be negative where it should not: two nearly
/// equal terms (E[x²] − E[x]², a variance by hand) round below 0.
pub(super) fn cancellation(cx: &Cx, x: &Read) -> Result<String> {
    Ok(match cx.maker_through_views(x)? {
        Some((j, OpKind::Sub)) => format!(
            "; {} is a difference of two terms, which rounding takes below 0 where they nearly cancel (as E[x²] − E[x]² does for a variance)",
            cx.name_of(j)
        ),
        _ => String::new(),
    })
}

/// The backward pass of a root (or a power below 1) at exactly 0: the
/// positions where the gradient passed back to operand `k` is not finite
/// are where the op's output is 0.
pub(super) fn slope_at_zero(
    cx: &Cx,
    i: usize,
    k: usize,
    grad: &Tensor,
    what: &str,
) -> Result<Option<Explanation>> {
    let reads = cx.reads(i);
    let Some(x) = reads.get(k).copied() else {
        return Ok(None);
    };
    let (g, y) = (values(grad)?, values(cx.output(i))?);
    if g.len() != y.len() {
        return Ok(None);
    }
    let bad: Vec<bool> = g.iter().map(|v| !v.is_finite()).collect();
    let n = bad.iter().filter(|&&b| b).count();
    let at_zero = y.iter().zip(&bad).filter(|&(&v, &b)| b && v == 0.0).count();
    if n == 0 || at_zero != n {
        return Ok(None);
    }
    let why = cx.why_zero(&x, &bad)?;
    let (pattern, repair) = match why.as_ref().map(|z| z.cause) {
        Some(ZeroCause::ZeroRows) => (
            Pattern::RootOfReducedZero,
            rewrite_with_eps(cx, i, &x)
                .unwrap_or_else(|| "sqrt(sum(x²) + eps) instead of sqrt(sum(x²))".into()),
        ),
        _ => (
            Pattern::InfiniteSlopeAtZero,
            rewrite_with_eps(cx, i, &x)
                .unwrap_or_else(|| format!("add an eps under the {what}: sqrt(x + eps)")),
        ),
    };
    let mut sentence = format!(
        "the backward pass of {} takes the derivative of a {what} at exactly 0: {} of its output {} 0 where the gradient it passes back to {} is not finite",
        cx.subject(i),
        counted(n, "value"),
        super::walk::are(n),
        cx.name(&x)?
    );
    if let Some(z) = why {
        sentence.push_str(&format!("; {}", z.why));
    }
    cx.explained(i, pattern, n, Some(&x), sentence, repair)
        .map(Some)
}

/// The op's own line with an eps added to what the root reads, where its
/// text ends in `.sqrt()` of a receiver: `(h.relu()? + 1e-8)?.sqrt()`.
fn rewrite_with_eps(cx: &Cx, i: usize, _x: &Read) -> Option<String> {
    let text = &cx.site(i)?.text;
    let recv = text.strip_suffix(".sqrt()")?;
    Some(format!(
        "add an eps under the root: `({recv} + 1e-8)?.sqrt()` instead of `{text}`"
    ))
}
