//! log(x): −inf at 0, NaN below it. A log of exact zeros is explained by
//! what made them — a softmax that underflowed (log_softmax is the
//! repair), 1 − a sigmoid that rounded to 1 (−softplus), a ReLU — and by
//! what follows: a product that multiplies the −inf by 0 (0·log 0 = NaN).
//! A log-softmax fails only on a row that is entirely −inf (a mask).

use super::walk::{counted, num, values, Cx, Range, ZeroCause};
use super::{non_finite, OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use candle_core::{DType, Tensor};

pub(super) struct Log;

impl OpRule for Log {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Log, OpKind::LogSoftmax]
    }

    fn id(&self) -> &'static str {
        "log_of_zero"
    }

    fn domain(&self) -> &'static str {
        "log of 0"
    }

    fn at_zero(&self) -> bool {
        true
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        let y = values(v.output)?;
        if y.iter().any(|x| !x.is_finite()) {
            return Ok(Some(0.0));
        }
        let tiny = Range::of(v.output.dtype()).tiny;
        let lo = y.iter().copied().fold(f64::INFINITY, f64::min);
        Ok(Some(((lo - tiny.ln()) / std::f64::consts::LN_10).max(0.0)))
    }

    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        let y = v.output.to_dtype(DType::F32)?.flatten_all()?;
        Ok(Some(y.min(0)?.neg()?))
    }

    /// −inf alone is a log of zeros; NaN a log of negatives (a
    /// log-softmax makes NaN only of a masked row, told by its values).
    fn stage_pattern(&self, kind: OpKind, out: &[f64]) -> Option<Pattern> {
        let nan = out.iter().any(|v| v.is_nan());
        if out.contains(&f64::NEG_INFINITY) && !nan {
            return Some(Pattern::LogOfZero);
        }
        (nan && kind == OpKind::Log).then_some(Pattern::NegativeDomain)
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        if cx.kind(i) == Some(OpKind::LogSoftmax) {
            return super::softmax::masked_rows(cx, i);
        }
        let reads = cx.reads(i);
        let Some(x) = reads.first().copied() else {
            return Ok(None);
        };
        let out = values(cx.output(i))?;
        let xs = values(x.tensor)?;
        if xs.len() != out.len() || !xs.iter().all(|v| v.is_finite()) {
            return Ok(None);
        }
        let at_zero: Vec<bool> = xs
            .iter()
            .zip(&out)
            .map(|(&a, &b)| a == 0.0 && b == f64::NEG_INFINITY)
            .collect();
        let zeros = at_zero.iter().filter(|&&z| z).count();
        let neg_inf = out.iter().filter(|&&v| v == f64::NEG_INFINITY).count();
        let negative = xs
            .iter()
            .zip(&out)
            .filter(|&(&a, b)| a < 0.0 && b.is_nan())
            .count();
        let nan = out.iter().filter(|v| v.is_nan()).count();
        let subject = cx.subject(i);
        let name = cx.name(&x)?;
        if zeros > 0 && zeros == neg_inf && negative == nan {
            return log_of_zeros(cx, i, &x, &at_zero, zeros).map(Some);
        }
        if negative > 0 && negative == nan {
            let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let sign = match cx.maker_through_views(&x)? {
                Some((_, k))
                    if matches!(
                        k,
                        OpKind::Layer | OpKind::Linear | OpKind::Matmul | OpKind::Sub | OpKind::Add
                    ) =>
                {
                    format!(" ({} is a {k}, which takes either sign)", name)
                }
                _ => String::new(),
            };
            let e = cx.explained(
                i,
                Pattern::NegativeDomain,
                negative,
                Some(&x),
                format!(
                    "{subject} takes the log of {} of {name} that {} negative (down to {}): NaN{sign}",
                    counted(negative, "value"),
                    super::walk::are(negative),
                    num(lo)
                ),
                "make what the log reads positive by construction (softplus or exp of it), or clamp it to at least an eps: `x.maximum(1e-8)?.log()`".into(),
            )?;
            return Ok(Some(e));
        }
        Ok(None)
    }
}

/// A log of exact zeros of `x`, told by what made them and by a product
/// after it that multiplies the −inf by 0.
fn log_of_zeros(
    cx: &Cx,
    i: usize,
    x: &crate::models::graph::Read,
    at: &[bool],
    zeros: usize,
) -> Result<Explanation> {
    let subject = cx.subject(i);
    let name = cx.name(x)?;
    let why = cx.why_zero(x, at)?;
    let times_zero = zero_factor_after(cx, i, at)?;
    let text = cx.site(i).map(|s| s.text.clone()).unwrap_or_default();
    let (mut pattern, mut repair) = (
        Pattern::LogOfZero,
        "clamp what the log reads to at least an eps (`x.maximum(1e-8)?.log()`), or compute it in log space".to_string(),
    );
    match why.as_ref().map(|z| z.cause) {
        Some(ZeroCause::UnderflowedSoftmax(_)) => {
            pattern = Pattern::LogOfUnderflowedSoftmax;
            repair = match log_softmax_rewrite(&text) {
                Some(r) => format!("take the log in log space: `{r}` instead of `{text}`"),
                None => "take the log in log space: candle_nn::ops::log_softmax(&logits, D::Minus1) instead of the log of a softmax (or a cross-entropy on the logits)".into(),
            };
        }
        Some(ZeroCause::SaturatedGate(_)) => {
            pattern = Pattern::SaturatedGate;
            repair = "compute it from the logits: log(1 − sigmoid(z)) = −softplus(z) and log(sigmoid(z)) = −softplus(−z) (a binary cross-entropy on logits), or clamp the gate into [eps, 1 − eps]".into();
        }
        _ => {}
    }
    let mut sentence = format!(
        "{subject} takes the log of {} of {name} that {} exactly 0: log(0) = −inf",
        counted(zeros, "value"),
        super::walk::are(zeros)
    );
    if let Some(z) = &why {
        sentence.push_str(&format!("; {}", z.why));
    }
    if let Some((j, n)) = times_zero {
        sentence.push_str(&format!(
            "; then {} multiplies that −inf by 0 in {}: 0·(−inf) = NaN",
            cx.subject(j),
            counted(n, "value")
        ));
        if pattern == Pattern::LogOfZero || pattern == Pattern::LogOfUnderflowedSoftmax {
            pattern = Pattern::ZeroTimesLogOfZero;
            if why.is_none() {
                repair = "skip the zero terms (where(p > 0, t·log(p), 0), as xlogy does), or clamp p to at least an eps before the log".into();
            }
        }
    }
    cx.explained(i, pattern, zeros, Some(x), sentence, repair)
}

/// A product after op `i` (directly, or through sums and differences that
/// keep its −inf) whose other factor is 0 where `i` made −inf: the
/// product's record and how many such entries.
fn zero_factor_after(cx: &Cx, i: usize, at: &[bool]) -> Result<Option<(usize, usize)>> {
    let mut frontier = vec![i];
    for _ in 0..3 {
        let mut next = Vec::new();
        for &k in &frontier {
            for j in cx.g.consumers(k) {
                match cx.kind(j) {
                    Some(OpKind::Mul) => {
                        if let Some(found) = times_zero(cx, j, k, i, at)? {
                            return Ok(Some(found));
                        }
                    }
                    Some(OpKind::Add | OpKind::Sub | OpKind::Neg | OpKind::View) => next.push(j),
                    _ => {}
                }
            }
        }
        frontier = next;
    }
    Ok(None)
}

/// Whether the product `j` (reading `from`, which carries op `i`'s −inf)
/// multiplies it by 0 where `i` made −inf.
fn times_zero(
    cx: &Cx,
    j: usize,
    from: usize,
    i: usize,
    at: &[bool],
) -> Result<Option<(usize, usize)>> {
    if !non_finite(cx.output(j))? || cx.output(from).dims() != cx.output(i).dims() {
        return Ok(None);
    }
    for other in cx.reads(j) {
        if other.from == Some(from) {
            continue;
        }
        let Some(o) = super::walk::aligned(other.tensor, cx.output(i))? else {
            continue;
        };
        let n = o.iter().zip(at).filter(|&(&v, &z)| z && v == 0.0).count();
        if n > 0 {
            return Ok(Some((j, n)));
        }
    }
    Ok(None)
}

/// `softmax(z, d)?.log()` written as `log_softmax(z, d)`.
fn log_softmax_rewrite(text: &str) -> Option<String> {
    let start = text.find("softmax")?;
    let rest = text.strip_suffix(".log()")?;
    let rest = rest.strip_suffix('?').unwrap_or(rest);
    let (head, tail) = rest.split_at(start);
    let tail = tail.replacen("softmax_last_dim(", "log_softmax(", 1);
    let tail = if tail.starts_with("log_softmax(") && !tail.contains(',') {
        tail.replacen(')', ", D::Minus1)", 1)
    } else {
        tail.replacen("softmax(", "log_softmax(", 1)
    };
    Some(format!("{head}{tail}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_log_of_a_softmax_is_rewritten_as_a_log_softmax() {
        assert_eq!(
            super::log_softmax_rewrite("candle_nn::ops::softmax(&z, D::Minus1)?.log()").as_deref(),
            Some("candle_nn::ops::log_softmax(&z, D::Minus1)")
        );
        assert_eq!(
            super::log_softmax_rewrite("ops::softmax_last_dim(&z)?.log()").as_deref(),
            Some("ops::log_softmax(&z, D::Minus1)")
        );
        assert_eq!(super::log_softmax_rewrite("p.log()"), None);
    }
}
