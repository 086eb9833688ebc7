//! One rule per op kind with an unsafe domain, in one place: its domain,
//! its margin (how far an op stayed from it, in decades), the pressure the
//! hunt follows toward it, and the explanation of a failure at it — read
//! from what the op actually read and, through the op graph, from the ops
//! that made that (compositions: 0·(−inf), 0/0, exp then log, a root at 0
//! backward, a variance of one value, a half-precision cast of a
//! constant, a saturated gate). Gathered in [`RULES`], looked up by kind
//! ([`rule`]); a kind without a rule has no unsafe domain of its own.
//!
//! | file | kinds | unsafe when | margin (decades) |
//! |---|---|---|---|
//! | log | log, log_softmax | its input reaches 0 (−inf) or below (NaN) | min(log x) over ln(tiny) |
//! | exp | exp | its output passes the dtype's largest | log10(max / max(exp x)) |
//! | sqrt, pow | sqrt, pow | the input reaches 0 (an infinite slope) or below | log10(min(x)² / tiny) |
//! | div | div | a denominator reaches 0, or the quotient the range's end | log10(max / max\|y\|) |
//! | softmax | softmax | a row entirely −inf (set by a mask, not by values) | — |
//! | variance | variance | one value along the reduced axis (set by a shape) | — |
//! | cast | cast | a value past the target dtype's range | log10(max / max\|x\|) |
//! | product | mul | 0·∞; in half precision, past the range | log10(max / max\|y\|) |
//! | sum | add, sub | ∞ − ∞; in half precision, past the range | log10(max / max\|y\|) |
//! | accumulate | matmul, reduce, layer, linear, conv, scores (half precision) | past the range | log10(max / max\|y\|) |
//! | norm | norm (a stage declared so) | a row of its input all zeros | log10(min row Σx² / tiny) |

mod accumulate;
mod cast;
mod div;
mod exp;
mod log;
mod norm;
mod pow;
mod product;
pub mod rewrite;
mod softmax;
mod sqrt;
mod sum;
mod variance;
pub mod walk;
mod widen;

use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use crate::models::graph::OpGraph;
use candle_core::{DType, Tensor};
pub use walk::Cx;

/// What the hunt reads of an op: what it made, the tensors it read (for a
/// stage recorded by name, the record before it) and its numbers.
#[derive(Clone)]
pub struct View<'a> {
    pub output: &'a Tensor,
    pub reads: Vec<&'a Tensor>,
    pub scalars: Vec<f64>,
}

impl<'a> View<'a> {
    /// Record `i` of `g` as the hunt sees it; `input` stands for what the
    /// first record read (the model's input).
    pub fn of(g: &OpGraph<'a>, i: usize, input: &'a Tensor) -> View<'a> {
        let mut reads: Vec<&'a Tensor> = g.reads(i).into_iter().map(|r| r.tensor).collect();
        if reads.is_empty() && g.records[i].site.is_none() {
            reads.push(input);
        }
        View {
            output: &g.records[i].output,
            reads,
            scalars: g.scalars(i),
        }
    }

    /// The first float tensor it read.
    pub fn read(&self) -> Option<&'a Tensor> {
        self.reads.iter().copied().find(|t| t.dtype().is_float())
    }
}

/// The rule of an op kind (see the module's table).
pub trait OpRule: Sync {
    /// The kinds it is the rule of.
    fn kinds(&self) -> &'static [OpKind];

    /// Its name in reports (`log_of_zero`).
    fn id(&self) -> &'static str;

    /// Its unsafe domain in words (`log of 0`).
    fn domain(&self) -> &'static str;

    /// Whether an op of this kind computing in `dtype` has an unsafe domain
    /// the hunt searches.
    fn risky(&self, dtype: DType) -> bool {
        dtype.is_float()
    }

    /// Why the input's values cannot move it (a mask, a shape), if so.
    fn not_searched(&self) -> Option<&'static str> {
        None
    }

    /// Whether token models search it by padding a row (its unsafe point is
    /// which positions a mask covers, and padding is what masks them).
    fn by_padding(&self) -> bool {
        false
    }

    /// Whether its unsafe point is a 0 that a row of zeros reaches (the
    /// hunt also tries the smallest row zeroed).
    fn at_zero(&self) -> bool {
        false
    }

    /// How far the op stayed from its unsafe domain, in decades (0: it
    /// reached it); `None` when it cannot be read. By default the distance
    /// of its largest magnitude from the dtype's largest value.
    fn margin(&self, v: &View) -> Result<Option<f64>> {
        overflow_margin(v.output)
    }

    /// The scalar (in f32, differentiable) that grows as the op nears its
    /// unsafe domain; `None` when it cannot be read. By default its
    /// largest magnitude.
    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        overflow_pressure(v.output)
    }

    /// For a stage recorded by name that declares this kind (`record_as`):
    /// the pattern its non-finite outputs `out` make when the values it
    /// read cannot tell (what it read is computed inside the stage).
    fn stage_pattern(&self, kind: OpKind, out: &[f64]) -> Option<Pattern> {
        let _ = (kind, out);
        None
    }

    /// The explanation of op `i`, the first to make non-finite values.
    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        let _ = (cx, i);
        Ok(None)
    }

    /// The explanation of op `i`'s backward pass, which made the gradient
    /// of its `k`th tensor operand non-finite (`grad`: that gradient).
    fn backward(&self, cx: &Cx, i: usize, k: usize, grad: &Tensor) -> Result<Option<Explanation>> {
        let _ = (cx, i, k, grad);
        Ok(None)
    }
}

/// `e` with the rewrite of op `i` it calls for, where one fits.
fn with_rewrite(cx: &Cx, i: usize, mut e: Explanation) -> Result<Explanation> {
    e.rewrite = rewrite::choose(cx, i, &e)?;
    Ok(e)
}

/// Every rule.
pub static RULES: &[&dyn OpRule] = &[
    &log::Log,
    &exp::Exp,
    &sqrt::Sqrt,
    &pow::Pow,
    &div::Div,
    &softmax::Softmax,
    &variance::Variance,
    &cast::Cast,
    &product::Product,
    &sum::Sum,
    &accumulate::Accumulate,
    &norm::Norm,
];

/// The rule of `kind`, if it has one.
pub fn rule(kind: OpKind) -> Option<&'static dyn OpRule> {
    RULES.iter().copied().find(|r| r.kinds().contains(&kind))
}

/// The rule of an op of `kind` computing in `dtype`, if it is risky there.
pub fn risk(kind: OpKind, dtype: DType) -> Option<&'static dyn OpRule> {
    rule(kind).filter(|r| r.risky(dtype))
}

/// The explanation of op `i`, the first producer of a forward failure:
/// its rule's, or an honest "unexplained" that says what it read.
pub fn explain_forward(g: &OpGraph, i: usize, inputs: &[&Tensor]) -> Result<Explanation> {
    let cx = Cx { g, inputs };
    if let Some(kind) = cx.kind(i) {
        if let Some(e) = rule(kind).map(|r| r.forward(&cx, i)).transpose()?.flatten() {
            return with_rewrite(&cx, i, e);
        }
    }
    unexplained(&cx, i, None)
}

/// The explanation of op `i`'s backward pass, which made the gradient of
/// its `k`th tensor operand (`grad`) non-finite.
pub fn explain_backward(
    g: &OpGraph,
    i: usize,
    k: usize,
    grad: &Tensor,
    inputs: &[&Tensor],
) -> Result<Explanation> {
    let cx = Cx { g, inputs };
    if let Some(kind) = cx.kind(i) {
        if let Some(e) = rule(kind)
            .map(|r| r.backward(&cx, i, k, grad))
            .transpose()?
            .flatten()
        {
            return with_rewrite(&cx, i, e);
        }
    }
    let g_values = walk::values(grad)?;
    let bad = g_values.iter().filter(|v| !v.is_finite()).count();
    if !g_values.iter().any(|v| v.is_nan()) {
        let dt = walk::Range::of(grad.dtype());
        let read = cx.reads(i).get(k).copied();
        let e = cx.explained(
            i,
            Pattern::BackwardOverflow,
            bad,
            read.as_ref(),
            format!(
                "the backward pass of {} overflows {} in {} of the gradient of {}, from finite gradients",
                cx.subject(i),
                dt.name(),
                walk::counted(bad, "value"),
                match &read {
                    Some(r) => cx.name(r)?,
                    None => "its input".into(),
                }
            ),
            "scale the values this op works on down, or run it in f32".into(),
        )?;
        return Ok(e);
    }
    unexplained(&cx, i, Some(k))
}

/// What a failure at op `i` is when no rule tells: the values it made from
/// what it read, said plainly.
fn unexplained(cx: &Cx, i: usize, backward_of: Option<usize>) -> Result<Explanation> {
    let out = walk::values(cx.output(i))?;
    let bad = out.iter().filter(|v| !v.is_finite()).count();
    let reads = cx.reads(i);
    let mut names = Vec::new();
    for r in &reads {
        names.push(cx.name(r)?);
    }
    let read = match backward_of {
        Some(k) => reads.get(k),
        None => reads.first(),
    };
    let sentence = match backward_of {
        Some(k) => format!(
            "the backward pass of {} made the gradient of {} non-finite, by none of the known patterns",
            cx.subject(i),
            names.get(k).cloned().unwrap_or_else(|| "its input".into())
        ),
        None => format!(
            "{} made {} from {}, by none of the known patterns",
            cx.subject(i),
            walk::counted(bad, "non-finite value"),
            if names.is_empty() {
                "its inputs".to_string()
            } else {
                names.join(" and ")
            }
        ),
    };
    cx.explained(
        i,
        Pattern::Unexplained,
        bad,
        read,
        sentence,
        "keep this op's inputs inside its safe domain".into(),
    )
}

/// A half precision: where products, sums and casts leave the range.
fn half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// Decades from `ratio` (at least 0).
fn decades(ratio: f64) -> f64 {
    ratio.log10().max(0.0)
}

/// The margin of an overflow: decades between the largest magnitude of `y`
/// and the dtype's largest value.
fn overflow_margin(y: &Tensor) -> Result<Option<f64>> {
    let r = walk::Range::of(y.dtype());
    let v = walk::values(y)?;
    if v.iter().any(|x| !x.is_finite()) {
        return Ok(Some(0.0));
    }
    let hi = v.iter().fold(r.tiny, |m, x| m.max(x.abs()));
    Ok(Some(decades(r.max / hi)))
}

/// The pressure toward an overflow: the largest magnitude of `y`.
fn overflow_pressure(y: &Tensor) -> Result<Option<Tensor>> {
    Ok(Some(y.to_dtype(DType::F32)?.flatten_all()?.abs()?.max(0)?))
}

/// Whether `t` holds a non-finite value.
fn non_finite(t: &Tensor) -> Result<bool> {
    Ok(walk::values(t)?.iter().any(|v| !v.is_finite()))
}
