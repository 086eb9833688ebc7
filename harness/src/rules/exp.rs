//! exp(x): +inf once x passes ln of the dtype's largest value (88.7 in
//! f32, 11.1 in f16). Explained by what made x — a scale (exp(k·z): the
//! factor that took z past), a negation (exp(−h) of a hand-written
//! sigmoid) — and by what follows: a sum and a log (a logsumexp without
//! its max), a division by its own sum (a softmax without its max).

use super::walk::{counted, num, values, Cx, Range};
use super::{decades, OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use candle_core::{DType, Tensor};

pub(super) struct Exp;

impl OpRule for Exp {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Exp]
    }

    fn id(&self) -> &'static str {
        "exp_overflow"
    }

    fn domain(&self) -> &'static str {
        "exp past the range"
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        let y = values(v.output)?;
        if y.iter().any(|x| !x.is_finite()) {
            return Ok(Some(0.0));
        }
        let r = Range::of(v.output.dtype());
        let hi = y.iter().copied().fold(r.tiny, f64::max);
        Ok(Some(decades(r.max / hi)))
    }

    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        Ok(Some(v.output.to_dtype(DType::F32)?.flatten_all()?.max(0)?))
    }

    /// +inf alone from an exp is its overflow.
    fn stage_pattern(&self, _: OpKind, out: &[f64]) -> Option<Pattern> {
        let nan = out.iter().any(|v| v.is_nan());
        (out.contains(&f64::INFINITY) && !nan).then_some(Pattern::ExpOverflow)
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        let reads = cx.reads(i);
        let Some(x) = reads.first().copied() else {
            return Ok(None);
        };
        let out = values(cx.output(i))?;
        let xs = values(x.tensor)?;
        let r = Range::of(cx.output(i).dtype());
        if xs.len() != out.len() || out.iter().any(|v| v.is_nan()) {
            return Ok(None);
        }
        let over: Vec<usize> = (0..out.len())
            .filter(|&k| out[k] == f64::INFINITY && xs[k].is_finite())
            .collect();
        let infinite = out.iter().filter(|v| v.is_infinite()).count();
        if over.is_empty() || over.len() != infinite {
            return Ok(None);
        }
        let top = over
            .iter()
            .map(|&k| xs[k])
            .fold(f64::NEG_INFINITY, f64::max);
        let (subject, name) = (cx.subject(i), cx.name(&x)?);
        let n = counted(over.len(), "value");
        let mut pattern = Pattern::ExpOverflow;
        let mut sentence = format!(
            "{subject} takes exp of {n} of {name} above {:.1} = ln of {}'s largest value {} (up to {}): +inf",
            r.ln_max,
            r.name(),
            num(r.max),
            num(top)
        );
        let mut repair = format!(
            "keep what the exp reads below {:.0}: clamp it (`x.minimum({:.0})?.exp()`), or work in log space",
            r.ln_max.floor(),
            r.ln_max.floor() - 9.0
        );
        // What made x: a scale, a negation.
        if let Some((j, kind)) = cx.maker_through_views(&x)? {
            let scalars = cx.g.scalars(j);
            if kind == OpKind::Mul && scalars.len() == 1 {
                let k = scalars[0];
                if let Some(z) = cx.reads(j).first() {
                    let zs = super::walk::aligned(z.tensor, x.tensor)?.unwrap_or_default();
                    let peak = over
                        .iter()
                        .filter_map(|&p| zs.get(p).copied())
                        .fold(f64::NEG_INFINITY, |m, v| m.max(v * k.signum()));
                    if peak.is_finite() && peak.abs() * k.abs() > r.ln_max && peak.abs() <= r.ln_max
                    {
                        pattern = Pattern::ExpOfScaledInput;
                        sentence = format!(
                            "{subject} takes exp of {n} of {} past {:.1} = ln of {}'s largest value: {} scales {} (at most {} there, inside the range) by {}, so the exp reads up to {}: +inf",
                            cx.name_of(j),
                            r.ln_max,
                            r.name(),
                            cx.name_of(j),
                            cx.name(z)?,
                            num(peak.abs()),
                            num(k),
                            num(top)
                        );
                    }
                }
            }
            if kind == OpKind::Neg {
                sentence.push_str(&format!(
                    "; {} negates {}, which goes below −{:.1} there",
                    cx.name_of(j),
                    cx.reads(j)
                        .first()
                        .map(|z| cx.name(z))
                        .transpose()?
                        .unwrap_or_default(),
                    r.ln_max
                ));
            }
        }
        // What follows: a sum and a log, a division by its own sum.
        for j in cx.g.consumers(i) {
            match cx.kind(j) {
                Some(OpKind::Reduce) => {
                    if let Some(l) =
                        cx.g.consumers(j)
                            .into_iter()
                            .find(|&l| cx.kind(l) == Some(OpKind::Log))
                    {
                        pattern = Pattern::LogOfOverflowedExp;
                        sentence.push_str(&format!(
                            "; {} sums it and {} takes the log: a logsumexp without its max subtracted",
                            cx.name_of(j),
                            cx.name_of(l)
                        ));
                        repair = "subtract the row's max first: max + log(sum(exp(x − max))), candle's `x.log_sum_exp(D::Minus1)`".into();
                        break;
                    }
                    if let Some(d) = cx.g.consumers(j).into_iter().find(|&d| {
                        cx.kind(d) == Some(OpKind::Div)
                            && cx.reads(d).first().is_some_and(|a| a.from == Some(i))
                    }) {
                        sentence.push_str(&format!(
                            "; {} divides it by its own sum: a softmax without the max subtracted",
                            cx.name_of(d)
                        ));
                        repair = "use candle_nn::ops::softmax_last_dim (the max subtracted before the exp) instead of exp(x) / sum(exp(x))".into();
                        break;
                    }
                }
                Some(OpKind::Add) if cx.g.scalars(j).contains(&1.0) => {
                    let next = cx.g.consumers(j);
                    if next
                        .iter()
                        .any(|&k| cx.site(k).is_some_and(|s| s.op == "recip"))
                    {
                        sentence.push_str(&format!(
                            "; {} and its reciprocal make a sigmoid by hand, 1/(1 + exp(−h))",
                            cx.name_of(j)
                        ));
                        repair = "use candle_nn::ops::sigmoid, which never overflows, instead of 1/(1 + exp(−h))".into();
                    } else if next.iter().any(|&k| cx.kind(k) == Some(OpKind::Log)) {
                        sentence.push_str(&format!(
                            "; {} and a log make a softplus by hand, log(1 + exp(x))",
                            cx.name_of(j)
                        ));
                        repair =
                            "a softplus that cannot overflow: relu(x) + log(1 + exp(−|x|))".into();
                    }
                }
                _ => {}
            }
        }
        cx.explained(i, pattern, over.len(), Some(&x), sentence, repair)
            .map(Some)
    }
}
