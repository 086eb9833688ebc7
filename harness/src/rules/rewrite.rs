//! The rewrite a developer would make of the op an explanation is about
//! ([`Rewrite`]), chosen from its pattern and from the ops that made what
//! it read: a log of a softmax (candle's or one by hand whose exp
//! overflows) becomes `log_softmax` of the softmax's logits; a log of exact zeros that a 0 multiplies, a root or a
//! fractional power at 0 take an eps inside; a log of 1 − a saturated
//! gate, a denominator that reaches 0 take a floor; an exp normalized by
//! its own sum has the row's max subtracted; a softplus by hand whose exp
//! overflows becomes the one that cannot, a logsumexp by hand candle's
//! `log_sum_exp`, any other overflowing exp a capped one; a constant cast past a half
//! dtype's range is clamped to a finite mask value first; infinities that
//! cancel are clamped to finite values that do; a variance of one value
//! becomes the biased one; a value past a half dtype's range is computed
//! in f32 from its op to where the values fit again. Where none fits (or the code cannot
//! be written from the operands' text), the explanation's repair in words
//! stands alone.

use super::walk::{one_minus, Arg, Cx};
use crate::error::Result;
use crate::finding::{is_place, Explanation, OpKind, Pattern, Rewrite, RewriteForm};
use crate::intervention::substitute::{eps, exp_cap, mask_fill, norm_eps};
use crate::models::graph::Read;

/// The rewrite of op `i` that `e` explains, if one fits.
pub fn choose(cx: &Cx, i: usize, e: &Explanation) -> Result<Option<Rewrite>> {
    use OpKind as K;
    use Pattern as P;
    use RewriteForm as F;
    let Some(site) = cx.site(i) else {
        return Ok(None);
    };
    let dtype = cx.output(i).dtype();
    let mut from = None;
    let form = match (site.kind, e.pattern) {
        (K::Log, _) if softmax_read(cx, i)?.is_some() => {
            from = softmax_read(cx, i)?.and_then(|j| cx.site(j).cloned());
            F::LogSoftmax
        }
        (K::Log, P::ZeroTimesLogOfZero | P::LogOfZero) => moved(site, eps(dtype)),
        (K::Log, P::SaturatedGate) => match neg_softplus(cx, i)? {
            Some(rewrite) => return Ok(Some(rewrite)),
            None => F::OperandFloor { floor: eps(dtype) },
        },
        (K::Sqrt | K::Pow, P::InfiniteSlopeAtZero | P::RootOfReducedZero) => {
            moved(site, norm_eps(dtype))
        }
        (K::Div, P::DivisionByZero | P::ZeroOverZero | P::ZeroNormRow) => {
            F::DenominatorFloor { floor: eps(dtype) }
        }
        (K::Exp, P::ExpOverflow | P::ExpOfScaledInput) if normalized(cx, i) => {
            // A softmax by hand whose log is taken: log_softmax of the
            // exp's input, at the log.
            if let Some(log) = logged_ratio(cx, i) {
                let rewrite = Rewrite {
                    site: cx.site(log).cloned().unwrap_or_else(|| site.clone()),
                    form: F::LogSoftmax,
                    from: Some(site.clone()),
                    input: None,
                    with: Vec::new(),
                };
                return Ok(rewrite.code().is_some().then_some(rewrite));
            }
            F::MaxSubtracted
        }
        (K::Exp, P::ExpOverflow | P::ExpOfScaledInput | P::LogOfOverflowedExp) => {
            // The log after it is rewritten where the exp is a softplus's
            // or a logsumexp's by hand; otherwise the exp is capped.
            let at_log = match (softplus_log(cx, i), summed_log(cx, i)) {
                (Some(log), _) => Some((log, F::Softplus)),
                (None, Some((log, keepdim_at))) => Some((log, F::LogSumExp { keepdim_at })),
                (None, None) => None,
            };
            let Some((log, form)) = at_log else {
                let rewrite = Rewrite {
                    site: site.clone(),
                    form: F::ClampedExp {
                        cap: exp_cap(dtype),
                    },
                    from: None,
                    input: None,
                    with: Vec::new(),
                };
                return Ok(rewrite.code().is_some().then_some(rewrite));
            };
            let rewrite = Rewrite {
                site: cx.site(log).cloned().unwrap_or_else(|| site.clone()),
                form,
                from: Some(site.clone()),
                input: None,
                with: Vec::new(),
            };
            return Ok(rewrite.code().is_some().then_some(rewrite));
        }
        (K::Cast, P::HalfCastOverflow) => F::ClampBeforeCast {
            limit: -mask_fill(dtype),
        },
        (K::Sub | K::Add, P::InfMinusInf) => F::FiniteOperands {
            limit: -mask_fill(dtype),
        },
        // A value past a half dtype's range: the region computed in f32.
        (_, P::AccumulationOverflow) => return super::widen::region(cx, i),
        (K::Variance, P::VarianceOfOneValue) => {
            let Some(dim) = site.operands.get(1).and_then(|d| d.parse().ok()) else {
                return Ok(None);
            };
            F::BiasedVariance {
                dim,
                keepdim: site.op.ends_with("_keepdim"),
            }
        }
        _ => return Ok(None),
    };
    let rewrite = Rewrite {
        site: site.clone(),
        form,
        from,
        input: None,
        with: Vec::new(),
    };
    Ok(rewrite.code().is_some().then_some(rewrite))
}

/// An op's input moved off 0 by `eps`: a value it makes on the spot takes
/// `+ eps`; a variable is floored at it instead (`x.maximum(eps)` borrows
/// it, where `x + eps` would move it).
fn moved(site: &crate::finding::OpSite, eps: f64) -> RewriteForm {
    match site.operands.first().is_some_and(|x| is_place(x)) {
        true => RewriteForm::OperandFloor { floor: eps },
        false => RewriteForm::OperandPlusEps { eps },
    }
}

/// The softmax over the last dimension, in the same function, that made
/// what log op `i` read.
fn softmax_read(cx: &Cx, i: usize) -> Result<Option<usize>> {
    let Some(read) = cx.reads(i).into_iter().next() else {
        return Ok(None);
    };
    let Some((j, OpKind::Softmax)) = cx.maker_through_views(&read)? else {
        return Ok(None);
    };
    let (Some(s), Some(at)) = (cx.site(j), cx.site(i)) else {
        return Ok(None);
    };
    let last_dim = match s.op.as_str() {
        "softmax_last_dim" => true,
        "softmax" => s.operands.get(1).is_some_and(|d| {
            d.ends_with("Minus1") || d.parse::<usize>().ok() == Some(cx.output(j).rank() - 1)
        }),
        _ => false,
    };
    Ok((last_dim && s.function == at.function).then_some(j))
}

/// log op `i` of 1 − σ(z) rewritten as −softplus(z), where the sigmoid is
/// candle's or one by hand, 1 / (1 + exp(−z)), and `z` has a name in the
/// log's function: the sigmoid's operand where it is in that function,
/// otherwise the name a `let` there bound it to (and nothing rebound since).
fn neg_softplus(cx: &Cx, i: usize) -> Result<Option<Rewrite>> {
    let Some(at) = cx.site(i) else {
        return Ok(None);
    };
    let Some(read) = cx.reads(i).first().copied() else {
        return Ok(None);
    };
    let Some((j, _)) = cx.maker_through_views(&read)? else {
        return Ok(None);
    };
    let Some(gate) = cx.reads(j).first().copied().filter(|_| one_minus(cx, j)) else {
        return Ok(None);
    };
    let Some((from, z)) = sigmoid_logits(cx, &gate)? else {
        return Ok(None);
    };
    let Some(from_site) = cx.site(from) else {
        return Ok(None);
    };
    let input = match from_site.function == at.function {
        true => None,
        false => match bound_name(cx, &z, i)? {
            Some(name) => Some(name),
            None => return Ok(None),
        },
    };
    let rewrite = Rewrite {
        site: at.clone(),
        form: RewriteForm::NegSoftplus,
        from: Some(from_site.clone()),
        input,
        with: Vec::new(),
    };
    Ok(rewrite.code().is_some().then_some(rewrite))
}

/// The op whose first read is a sigmoid's logits, and those logits, where
/// `gate` is a sigmoid: candle's (the op itself), or 1 / (1 + exp(−z)) by
/// hand (the negation).
fn sigmoid_logits<'r>(cx: &Cx<'_, 'r>, gate: &Read<'r>) -> Result<Option<(usize, Read<'r>)>> {
    let Some((k, kind)) = cx.maker_through_views(gate)? else {
        return Ok(None);
    };
    if kind == OpKind::Sigmoid {
        return Ok(cx.reads(k).first().map(|z| (k, *z)));
    }
    let recip = cx.site(k).is_some_and(|s| s.op == "recip");
    let one_over = cx.site(k).is_some_and(|s| s.op == "/")
        && matches!(cx.args(k).first(), Some(Arg::Scalar(v)) if *v == 1.0);
    if !(recip || one_over) {
        return Ok(None);
    }
    // What the division reads: 1 + exp(−z), through to the negation.
    let mut at = cx.reads(k).last().copied();
    let mut chain = Vec::new();
    for want in [OpKind::Add, OpKind::Exp, OpKind::Neg] {
        let Some(r) = at else {
            return Ok(None);
        };
        let Some((m, kind)) = cx.maker_through_views(&r)? else {
            return Ok(None);
        };
        let plus_one = want != OpKind::Add || cx.g.scalars(m) == [1.0];
        if kind != want || !plus_one {
            return Ok(None);
        }
        chain.push(m);
        at = cx.reads(m).first().copied();
    }
    Ok(at.map(|z| (chain[2], z)))
}

/// The name a `let` in op `i`'s function bound the tensor `z` to, where
/// nothing in that function bound the name again before op `i`.
fn bound_name(cx: &Cx, z: &Read, i: usize) -> Result<Option<String>> {
    let Some(function) = cx.site(i).map(|s| &s.function) else {
        return Ok(None);
    };
    let Some(m) = cx.maker(z)? else {
        return Ok(None);
    };
    let Some(name) = cx
        .site(m)
        .filter(|s| &s.function == function)
        .and_then(|s| s.binding.clone())
    else {
        return Ok(None);
    };
    let rebound = (m + 1..i).any(|r| {
        cx.site(r)
            .is_some_and(|s| &s.function == function && s.binding.as_ref() == Some(&name))
    });
    Ok((!rebound).then_some(name))
}

/// The log op, in the same function, of exp op `i`'s output divided by
/// its own sum (the log of a softmax by hand).
fn logged_ratio(cx: &Cx, i: usize) -> Option<usize> {
    cx.g.consumers(i)
        .into_iter()
        .filter(|&d| cx.kind(d) == Some(OpKind::Div))
        .flat_map(|d| cx.g.consumers(d))
        .find(|&c| {
            cx.kind(c) == Some(OpKind::Log)
                && cx.site(c).map(|s| &s.function) == cx.site(i).map(|s| &s.function)
        })
}

/// The log op of a softplus by hand, log(exp(x) + 1), whose exp is op
/// `i` (the rewrite replaces the log's expression).
fn softplus_log(cx: &Cx, i: usize) -> Option<usize> {
    let plus_one =
        cx.g.consumers(i)
            .into_iter()
            .find(|&c| cx.kind(c) == Some(OpKind::Add) && cx.g.scalars(c) == [1.0])?;
    cx.g.consumers(plus_one)
        .into_iter()
        .find(|&c| cx.kind(c) == Some(OpKind::Log) && cx.site(c).is_some())
}

/// The log op of a logsumexp by hand, log(sum(exp(x))) over the last
/// dimension in the same function, whose exp is op `i`; with where a
/// keepdim sum's dimension goes back.
fn summed_log(cx: &Cx, i: usize) -> Option<(usize, Option<usize>)> {
    let sum = cx.g.consumers(i).into_iter().find(|&c| {
        cx.kind(c) == Some(OpKind::Reduce)
            && cx.site(c).is_some_and(|s| {
                s.op.starts_with("sum") && s.operands.get(1).is_some_and(|d| d.ends_with("Minus1"))
            })
    })?;
    let log =
        cx.g.consumers(sum)
            .into_iter()
            .find(|&c| cx.kind(c) == Some(OpKind::Log))?;
    let same_fn = cx.site(log)?.function == cx.site(i)?.function;
    let keepdim = cx.site(sum)?.op == "sum_keepdim";
    let at = cx.output(sum).rank().checked_sub(1)?;
    same_fn.then_some((log, keepdim.then_some(at)))
}

/// Whether exp op `i`'s output is divided by its own sum over the last
/// dimension (a softmax by hand): subtracting the row's max keeps the ratio.
fn normalized(cx: &Cx, i: usize) -> bool {
    let consumers = cx.g.consumers(i);
    let summed = consumers.iter().any(|&c| {
        cx.kind(c) == Some(OpKind::Reduce)
            && cx.site(c).is_some_and(|s| {
                s.op.starts_with("sum") && s.operands.get(1).is_some_and(|d| d.ends_with("Minus1"))
            })
            && cx
                .g
                .consumers(c)
                .iter()
                .any(|k| consumers.contains(k) && cx.kind(*k) == Some(OpKind::Div))
    });
    summed
}
