//! The producer explanation: what the named stage did to make its first
//! non-finite values, read from the stage's output and from the record
//! before it (what the stage read, when the model records in order), in
//! the user's terms, with the repair that pattern calls for.
//!
//! Forward: the stage's non-finite outputs are compared, element by element
//! or row by row, with its input: a log of exact zeros, a log or root of
//! negative values, 0/0, a norm of an all-zero row, a softmax over a row
//! that is entirely -inf, an exp past the dtype's range, a sum or product
//! (a matmul) that leaves the dtype's range although its inputs are in it.
//! Backward: the stage's output is exactly 0 where the gradient it passes
//! back went non-finite (the derivative of sqrt or x^p, p < 1, at 0), or
//! its backward pass overflowed.

mod inside;
mod substitute;

use crate::error::Result;
use crate::finding::OpKind;
pub use crate::finding::{Explanation, Pattern};
use crate::models::Record;
use crate::spec::{dtype_max, machine_epsilon, smallest_positive};
use candle_core::{DType, Tensor};

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?)
}

/// The forward pattern of record `i`, the first non-finite one. `inputs`
/// are what the first record may have read: the model's input (the
/// runner), or the batch's tensors (a user's loop under the guard); the
/// one with the record's shape is taken.
///
/// A stage whose only non-finite values are -inf is a mask by design
/// (`masked_fill(-inf)`); when the record after it turns rows of it that are
/// entirely -inf into NaN, that next stage (the softmax) is what the
/// explanation is about.
pub fn forward(records: &[Record], i: usize, inputs: &[&Tensor]) -> Result<Explanation> {
    let out = values(&records[i].output)?;
    let mask_only =
        out.contains(&f64::NEG_INFINITY) && !out.iter().any(|v| v.is_nan() || *v == f64::INFINITY);
    if let (true, Some(next)) = (mask_only, records.get(i + 1)) {
        if next.output.dims() == records[i].output.dims() {
            let e = stage(records, i + 1, inputs)?;
            if e.pattern == Pattern::MaskedRow {
                return Ok(e);
            }
        }
    }
    stage(records, i, inputs)
}

/// What the first record read: the float input with its shape, else the
/// first float input.
fn first_input<'t>(inputs: &[&'t Tensor], like: &Tensor) -> Option<&'t Tensor> {
    let floats = || inputs.iter().copied().filter(|t| t.dtype().is_float());
    floats()
        .find(|t| t.dims() == like.dims())
        .or_else(|| floats().next())
}

/// The pattern of record `i`'s non-finite outputs against what it read:
/// the record before it, or for the first record the model's input.
fn stage(records: &[Record], i: usize, inputs: &[&Tensor]) -> Result<Explanation> {
    let r = &records[i];
    let out = values(&r.output)?;
    let before = i.checked_sub(1).map(|j| &records[j]);
    let dtype = r.output.dtype();
    let limit = dtype_max(dtype);
    let op = r.stage_op();
    let mut e = Explanation {
        pattern: Pattern::Unexplained,
        stage: r.name.clone(),
        input: before.map(|p| p.name.clone()),
        count: out.iter().filter(|v| !v.is_finite()).count(),
        by_name: false,
        sentence: String::new(),
        repair: String::new(),
        formulation: None,
        site: None,
        input_site: None,
        rewrite: None,
    };
    let read = match before {
        Some(p) => Some(&p.output),
        None => first_input(inputs, &r.output),
    };
    let x = match read {
        Some(t) => values(t)?,
        None => Vec::new(),
    };
    let mut from_values = false;
    let seen = inside::Seen {
        x: &x,
        x_dims: read.map_or(&[][..], |t| t.dims()),
        out: &out,
        out_dims: r.output.dims(),
        limit,
        tiny: smallest_positive(dtype),
    };
    let inner = op
        .and_then(|o| inside::find(o.kind, &seen))
        .or_else(|| inside::shifted_ratio(&seen));
    // A log's NaN where its input is 0 is 0·log(0), not 0/0: the
    // composition is read before the element patterns for a log or a loss.
    let log_like = op.is_some_and(|o| matches!(o.kind, OpKind::Log | OpKind::Loss));
    let read_elementwise = read
        .filter(|t| t.dims() == r.output.dims() && !x.is_empty() && !(log_like && inner.is_some()));
    if let Some((pattern, n)) = read_elementwise.and_then(|t| of_values(op, &x, t, &out, limit)) {
        e.pattern = pattern;
        e.count = n;
        from_values = true;
    }
    let mut quote = None;
    if let (Pattern::Unexplained, Some(found)) = (e.pattern, inner) {
        e.pattern = found.pattern;
        e.count = found.count;
        e.by_name = op.is_some_and(|op| op.guessed());
        quote = Some(found.quote);
    }
    if e.pattern == Pattern::Unexplained {
        of_kind(&mut e, op, &x, &out);
    }
    // The tracer substitutes at records: the stage must read one.
    let reads: Vec<&Record> = records[..i].iter().rev().take(2).collect();
    e.formulation = substitute::choose(e.pattern, from_values, &reads, &r.output)?;
    let x_max = x
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()));
    // What the record before held is quoted only when it accounts for the
    // pattern; an op-kind pattern is about a value computed inside the stage.
    let quoted = from_values || e.pattern == Pattern::AccumulationOverflow;
    describe(
        &mut e,
        dtype,
        limit,
        read.filter(|_| quoted).map(|_| x_max),
        from_values,
    );
    if let Some(q) = quote {
        e.sentence = e.sentence.replace(QUOTE, &q);
    }
    Ok(e)
}

/// The element- or row-wise pattern of `out` against `x`, what the op
/// read, of the output's shape (rows of its last dimension).
fn of_values(
    op: Option<crate::finding::StageOp>,
    x: &[f64],
    read: &Tensor,
    out: &[f64],
    limit: f64,
) -> Option<(Pattern, usize)> {
    let width = (*read.dims().last().unwrap_or(&1)).max(1);
    // A row-wise op's NaN is not an element's: a softmax over finite
    // scores that happen to be negative did not take their log.
    let row_wise =
        op.is_some_and(|o| matches!(o.kind, OpKind::Softmax | OpKind::LogSoftmax | OpKind::Norm));
    by_values(x, out, width, limit)
        .filter(|(p, _)| !row_wise || matches!(p, Pattern::MaskedRow | Pattern::ZeroNormRow))
}

/// Where the values cannot tell (the record before is not what the op
/// read, a log applied to a softmax inside the stage): the op's kind's
/// pattern, or a sum past the range of finite inputs.
fn of_kind(e: &mut Explanation, op: Option<crate::finding::StageOp>, x: &[f64], out: &[f64]) {
    let by_rule = |op: crate::finding::StageOp| {
        crate::rules::rule(op.kind).and_then(|r| r.stage_pattern(op.kind, out))
    };
    let overflowed = out.iter().any(|v| v.is_infinite()) && !out.iter().any(|v| v.is_nan());
    if let Some(p) = op.and_then(by_rule) {
        e.pattern = p;
        e.by_name = op.is_some_and(|op| op.guessed());
    } else if overflowed
        && x.iter().all(|v| v.is_finite())
        && op.is_none_or(|op| op.kind.accumulates())
    {
        e.pattern = Pattern::AccumulationOverflow;
        e.count = out.iter().filter(|v| v.is_infinite()).count();
    }
}

/// Where a composition's sentence takes its numbers.
const QUOTE: &str = "{quote}";

/// The element- or row-wise pattern that accounts for the non-finite
/// outputs `out` of the input `x` (rows of `width`), with its count.
fn by_values(x: &[f64], out: &[f64], width: usize, limit: f64) -> Option<(Pattern, usize)> {
    let rows = |pred: &dyn Fn(&[f64], &[f64]) -> bool| {
        x.chunks(width)
            .zip(out.chunks(width))
            .filter(|(xr, yr)| pred(xr, yr))
            .count()
    };
    let elems =
        |pred: &dyn Fn(f64, f64) -> bool| x.iter().zip(out).filter(|&(&a, &b)| pred(a, b)).count();
    let masked =
        rows(&|xr, yr| xr.iter().all(|&v| v == f64::NEG_INFINITY) && yr.iter().any(|v| v.is_nan()));
    let zero_rows = rows(&|xr, yr| xr.iter().all(|&v| v == 0.0) && yr.iter().all(|v| v.is_nan()));
    // An element-wise pattern must account for every output of its kind
    // (-inf, NaN, +inf): a matmul's overflow is not an exp's because a few
    // of its inputs happen to exceed ln(max).
    let all = |n: usize, of: fn(f64) -> bool| {
        let total = out.iter().filter(|&&v| of(v)).count();
        if n > 0 && n == total {
            n
        } else {
            0
        }
    };
    let log_zero = all(elems(&|a, b| a == 0.0 && b == f64::NEG_INFINITY), |v| {
        v == f64::NEG_INFINITY
    });
    let negative = all(elems(&|a, b| a < 0.0 && b.is_nan()), f64::is_nan);
    let zero_over_zero = all(elems(&|a, b| a == 0.0 && b.is_nan()), f64::is_nan);
    // Every infinity where the input is 0 and none that a log of it makes.
    let over_zero = if out.contains(&f64::INFINITY) {
        // Or so close to it that the quotient overflows (a subnormal).
        all(
            elems(&|a, b| a.abs() * limit < 1.0 && b.is_infinite()),
            f64::is_infinite,
        )
    } else {
        0
    };
    // A gate at exactly 1 where 1 - gate is taken (0 where gate is): every
    // non-finite output at an edge of [0, 1], and one at least at 1.
    let unit = x.iter().all(|a| (0.0..=1.0).contains(a));
    let at_one = elems(&|a, b| a == 1.0 && !b.is_finite());
    let gate = if unit && at_one > 0 {
        all(
            elems(&|a, b| (a == 0.0 || a == 1.0) && !b.is_finite()),
            |v| !v.is_finite(),
        )
    } else {
        0
    };
    let exp_past = all(
        elems(&|a, b| a.is_finite() && a > limit.ln() && b == f64::INFINITY),
        |v| v == f64::INFINITY,
    );
    [
        (Pattern::MaskedRow, masked),
        (Pattern::ZeroNormRow, zero_rows),
        (Pattern::SaturatedGate, gate),
        (Pattern::LogOfZero, log_zero),
        (Pattern::NegativeDomain, negative),
        (Pattern::ZeroOverZero, zero_over_zero),
        (Pattern::DivisionByZero, over_zero),
        (Pattern::ExpOverflow, exp_past),
    ]
    .into_iter()
    .find(|&(_, n)| n > 0)
}

/// The backward pattern of stage `p`, whose backward pass made the
/// gradient `grad` of record `receiver` non-finite.
pub fn backward(
    records: &[Record],
    p: usize,
    receiver: usize,
    grad: &Tensor,
) -> Result<Explanation> {
    let r = &records[p];
    let g = values(grad)?;
    let out = values(&r.output)?;
    let dtype = r.output.dtype();
    let limit = dtype_max(dtype);
    let bad = g.iter().filter(|v| !v.is_finite()).count();
    let mut e = Explanation {
        pattern: Pattern::Unexplained,
        stage: r.name.clone(),
        input: Some(records[receiver].name.clone()),
        count: bad,
        by_name: false,
        sentence: String::new(),
        repair: String::new(),
        formulation: None,
        site: None,
        input_site: None,
        rewrite: None,
    };
    if out.len() == g.len() {
        let at_zero = out
            .iter()
            .zip(&g)
            .filter(|&(&y, gv)| y == 0.0 && !gv.is_finite())
            .count();
        // Every non-finite gradient at an exact 0 of the output: an overflow
        // elsewhere in a backward pass that also has zeros is no root's slope.
        if at_zero > 0 && at_zero == bad {
            e.pattern = Pattern::InfiniteSlopeAtZero;
            e.count = at_zero;
        }
    }
    let x = &records[receiver].output;
    if e.pattern == Pattern::Unexplained {
        if let Some(rows) = zero_rows_of_a_root(x, &out, &r.output, &g)? {
            e.pattern = Pattern::RootOfReducedZero;
            e.count = rows;
        }
    }
    if e.pattern == Pattern::Unexplained && !g.iter().any(|v| v.is_nan()) {
        e.pattern = Pattern::BackwardOverflow;
    }
    e.formulation = substitute::choose(e.pattern, false, &[&records[receiver]], &r.output)?;
    describe(&mut e, dtype, limit, None, false);
    Ok(e)
}

/// For a stage that reduces its input's last dimension (a root of a sum
/// of squares), the rows whose output is exactly 0 where the gradient
/// passed back is not finite, when they account for every such gradient.
fn zero_rows_of_a_root(
    x: &Tensor,
    out: &[f64],
    stage: &Tensor,
    g: &[f64],
) -> Result<Option<usize>> {
    let Some(width) = inside::reduced_last(x.dims(), stage.dims()) else {
        return Ok(None);
    };
    if g.len() != out.len() * width {
        return Ok(None);
    }
    let xs = values(x)?;
    let bad = g.iter().filter(|v| !v.is_finite()).count();
    let mut covered = 0;
    let mut rows = 0;
    for (i, &y) in out.iter().enumerate() {
        let row = i * width..(i + 1) * width;
        let n = g[row.clone()].iter().filter(|v| !v.is_finite()).count();
        if n > 0 && y == 0.0 && xs[row].iter().all(|&v| v == 0.0) {
            covered += n;
            rows += 1;
        }
    }
    Ok((rows > 0 && covered == bad).then_some(rows))
}

/// "1 row", "3 rows".
fn counted(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Fills in the sentence and the repair of `e`'s pattern.
/// `read`: the pattern was read from the stage's input (the record before
/// it), whose values the sentence then quotes; else from its op's kind, on a
/// value the stage computes inside.
fn describe(e: &mut Explanation, dtype: DType, limit: f64, x_max: Option<f64>, read: bool) {
    let n = e.count;
    let w = Words {
        s: &e.stage,
        n,
        vals: counted(n, "value"),
        rows: counted(n, "row"),
        input: e
            .input
            .as_deref()
            .map_or(String::from("the model's input"), |i| {
                format!("its input `{i}`")
            }),
        input_name: e.input.as_deref().unwrap_or("its input"),
        dt: format!("{dtype:?}").to_lowercase(),
        dtype,
        limit,
        x_max,
        read,
    };
    let (sentence, repair) =
        value_words(e.pattern, &w).unwrap_or_else(|| composed_words(e.pattern, &w));
    let s = w.s;
    e.sentence = if e.by_name {
        format!("{sentence} (what `{s}` computes was read from its name; declare it with `record_as` or `trace_as`)")
    } else {
        sentence
    };
    e.repair = repair;
}

/// What [`describe`] words a pattern with.
struct Words<'a> {
    /// The stage.
    s: &'a str,
    /// How many values the pattern accounts for, and in words.
    n: usize,
    vals: String,
    rows: String,
    /// What the stage read, in words, and by its name alone.
    input: String,
    input_name: &'a str,
    /// The dtype, and its name.
    dt: String,
    dtype: DType,
    /// The dtype's largest value.
    limit: f64,
    /// The largest finite value read, where it accounts for the pattern.
    x_max: Option<f64>,
    /// The pattern was read from the values the stage read.
    read: bool,
}

/// The sentence and the repair of a pattern the values show (a log, a
/// root, a division, an exp, a sum past the range); `None` for the others.
fn value_words(pattern: Pattern, w: &Words) -> Option<(String, String)> {
    let Words {
        s,
        vals,
        rows,
        input,
        dt,
        limit,
        x_max,
        read,
        ..
    } = w;
    let (s, limit, x_max, read) = (*s, *limit, *x_max, *read);
    Some(match pattern {
        Pattern::LogOfZero if !read => (
            format!("`{s}` takes a log that is -inf at {vals}: what it takes the log of, computed inside the stage, is exactly 0 there: log(0) = -inf"),
            "compute it in log space (log_softmax instead of log(softmax), -softplus(x) instead of log(1 - sigmoid(x))), or clamp what the log reads to at least an eps".to_string(),
        ),
        Pattern::LogOfZero => (
            format!("`{s}` takes the log of {vals} of {input} that are exactly 0: log(0) = -inf"),
            "compute it in log space (log_softmax instead of log(softmax)), or clamp the input to at least an eps before the log".to_string(),
        ),
        Pattern::NegativeDomain if !read => (
            format!("`{s}` takes a log or a square root that is NaN at {vals}: what it reads, computed inside the stage, is negative there"),
            "make the input positive by construction (softplus, exp, or relu plus an eps), or clamp it to at least an eps".to_string(),
        ),
        Pattern::NegativeDomain => (
            format!("`{s}` takes the log or square root of {vals} of {input} that are negative: NaN"),
            "make the input positive by construction (softplus, exp, or relu plus an eps), or clamp it to at least an eps".to_string(),
        ),
        Pattern::ZeroNormRow => (
            format!("`{s}` divides by a norm that is exactly 0 for {rows} of the batch: those rows of {input} are all zeros, and 0/0 is NaN"),
            "add an eps to the denominator: x / (norm(x) + eps)".to_string(),
        ),
        Pattern::ZeroOverZero => (
            format!("`{s}` computes 0/0 at {vals} where {input} is exactly 0"),
            "add an eps to the denominator".to_string(),
        ),
        Pattern::DivisionByZero => (
            format!("`{s}` divides by {vals} of {input} that are exactly 0 (or so close to it that the quotient overflows): x/0 = inf (and the log of it, as in log(t/p), is +inf too)"),
            "add an eps to the denominator (or clamp it to at least an eps), or compute the ratio's log as a difference of logs in log space".to_string(),
        ),
        Pattern::MaskedRow => (
            format!("`{s}` takes a softmax over {rows} of {input} that are entirely -inf (every position masked): 0/0 = NaN"),
            "mask with a finite value the dtype holds (-1e4 in half precision), or give fully masked rows a defined output".to_string(),
        ),
        Pattern::ExpOverflow if !read => (
            format!(
                "`{s}` takes an exp that is +inf at {vals}: what it takes the exp of, computed inside the stage, passes {:.1} = ln of {dt}'s largest value {limit:.4e} there",
                limit.ln()
            ),
            format!("clamp what the exp reads below {:.0}, or use a bounded activation or work in log space (logsumexp with the max subtracted)", limit.ln().floor()),
        ),
        Pattern::ExpOverflow => (
            format!(
                "`{s}` takes exp of {vals} of {input} above {:.1} = ln of {dt}'s largest value {limit:.4e}{}: +inf",
                limit.ln(),
                x_max.map_or(String::new(), |m| format!(" (they reach {m:.3e})"))
            ),
            format!("clamp the input below {:.0} before the exp, or use a bounded activation or work in log space", limit.ln().floor()),
        ),
        Pattern::AccumulationOverflow => (
            format!(
                "`{s}` overflows {dt}: {}its result, a sum or product of them (a matmul, say), passes {dt}'s largest value {limit:.4e} in {vals}",
                x_max
                    .filter(|&m| m > 0.0)
                    .map_or(String::new(), |m| format!("{input} peaks at {m:.3e}, inside the range, but "))
            ),
            "scale before accumulating (q·k / sqrt(d) for attention scores, a mean instead of a sum), or accumulate in f32".to_string(),
        ),
        _ => return None,
    })
}

/// The sentence and the repair of a composition's pattern, a backward
/// pass's or an op's (and of a failure no pattern explains).
fn composed_words(pattern: Pattern, w: &Words) -> (String, String) {
    let Words {
        s,
        n,
        vals,
        rows,
        input,
        dt,
        dtype,
        limit,
        ..
    } = w;
    let (s, n, limit, dtype) = (*s, *n, *limit, *dtype);
    match pattern {
        Pattern::InfiniteSlopeAtZero => (
            format!(
                "the backward pass of `{s}` takes the derivative of a square root (or a power below 1) at exactly 0: {vals} of its output are 0 where the gradient it passes back to `{}` is not finite",
                w.input_name
            ),
            "sqrt(x + eps) instead of sqrt(x), or clamp x to at least an eps before the root".to_string(),
        ),
        Pattern::BackwardOverflow => (
            format!("the backward pass of `{s}` overflows {dt} in {} from finite ones", counted(n, "gradient value")),
            "scale the values the stage works on down, or run the stage in f32".to_string(),
        ),
        Pattern::ZeroTimesLogOfZero => (
            format!("`{s}` multiplies a log by 0 inside the stage: {input} holds probabilities, {QUOTE}; their log is -inf, and a factor of 0 there (a target's zero entry) makes 0·(-inf) = NaN"),
            "skip the zero terms (where(p > 0, t·log(p), 0), as xlogy does), clamp p to at least an eps before the log, or compute the loss from logits with log_softmax".to_string(),
        ),
        Pattern::LogOfUnderflowedSoftmax => (
            format!("`{s}` takes the log of a softmax that underflowed inside the stage: in {input}, {QUOTE}, so exp of their smallest entries is exactly 0 in {dt} and the log of those probabilities is -inf"),
            "use log_softmax (the max subtracted, the log taken in log space) or a cross-entropy on the logits instead of log(softmax(z))".to_string(),
        ),
        Pattern::ExpOfScaledInput => (
            format!("`{s}` takes an exp that is +inf at {vals} although {input} is inside the range: {QUOTE}"),
            format!("scale the input down, or clamp what the exp reads (k·x) below {:.0}, or work in log space", limit.ln().floor()),
        ),
        Pattern::ConstantNormalized => (
            format!("`{s}` divides by a standard deviation that is exactly 0: {input} has {QUOTE}, so (x - mean)/std is 0/0"),
            "add an eps under the root: (x - mean) / sqrt(var + eps)".to_string(),
        ),
        Pattern::SaturatedGate => (
            format!("`{s}` reads {input} at exactly 1 (or 0) in {vals}: a sigmoid rounds to exactly 1 in {dt} above {:.1}, so 1 - x there is 0, its log -inf, and a zero factor on it NaN", (2.0 / machine_epsilon(dtype)).ln()),
            "compute it from the logits: -softplus(z) for log(1 - sigmoid(z)) and -softplus(-z) for log(sigmoid(z)) (a binary cross-entropy on logits), or clamp the gate into [eps, 1 - eps]".to_string(),
        ),
        Pattern::MaskInsideSoftmax => (
            format!("`{s}` is NaN in whole rows although {input} is finite there: {QUOTE}; a mask added inside the stage left those rows no position, and the softmax of a row of -inf is 0/0"),
            "mask with a finite value the dtype holds (-1e9; -1e4 in half precision), or give fully masked rows a defined output".to_string(),
        ),
        Pattern::ShiftedRatio => (
            format!("`{s}` divides {input} by itself shifted by one: {QUOTE}, and 0/0 is NaN"),
            "compute the product in log space (a cumulative sum of logs; the ratio is the exp of a difference), use the factor itself, or add an eps to the denominator".to_string(),
        ),
        Pattern::RootOfReducedZero => (
            format!(
                "the backward pass of `{s}` takes the derivative of a root of a sum of squares at exactly 0 (sqrt(a² + b²) at the origin): {rows} of `{}` are all zeros, and the gradient there is 0/0",
                w.input_name
            ),
            "sqrt(sum(x²) + eps) instead of sqrt(sum(x²))".to_string(),
        ),
        Pattern::LogOfOverflowedExp => (
            format!("`{s}` takes the log of a sum of exps of {input}, which overflows: {QUOTE}, so exp of it is +inf in {dt}, and so are the sum and its log"),
            "subtract the row's max first: max + log(sum(exp(x - max))), a logsumexp".to_string(),
        ),
        // The op-level patterns ([`crate::rules`]), said of a stage.
        Pattern::ZeroTimesInfinity => (
            format!("`{s}` multiplies an infinity by exact zeros in {vals}: 0·inf = NaN"),
            "keep the infinite factor finite, or select instead of multiplying".to_string(),
        ),
        Pattern::InfMinusInf => (
            format!("`{s}` combines infinities that cancel in {vals}: inf − inf = NaN"),
            "keep both operands finite where they meet".to_string(),
        ),
        Pattern::VarianceOfOneValue => (
            format!("`{s}` takes an unbiased variance of one value: n − 1 = 0, and 0/0 = NaN in {vals}"),
            "divide by n, or keep batches of one row out".to_string(),
        ),
        Pattern::HalfCastOverflow => (
            format!("`{s}` casts values past {dt}'s range in {vals}: ±inf"),
            "keep the value inside the dtype's range before the cast".to_string(),
        ),
        // Unexplained, and none other reaches here: `value_words` words them.
        _ => (
            format!("`{s}` makes {} from finite inputs, by none of the known patterns", counted(n, "non-finite value")),
            "keep the stage's inputs in its op's safe domain".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn record(name: &str, values: &[f32], width: usize) -> Record {
        let t = Tensor::from_slice(values, (values.len() / width, width), &Device::Cpu).unwrap();
        Record {
            name: name.into(),
            op: None,
            grad_probe: Var::zeros(t.shape(), t.dtype(), t.device()).unwrap(),
            output: t,
            site: None,
            inputs: Vec::new(),
        }
    }

    const INF: f32 = f32::INFINITY;

    fn declared(name: &str, op: OpKind, values: &[f32], width: usize) -> Record {
        let mut r = record(name, values, width);
        r.op = Some(op);
        r
    }

    #[test]
    fn the_op_a_stage_declares_tells_the_pattern_and_a_name_is_a_marked_fallback() {
        // What the stage read is not the record before it (a log applied to
        // a softmax inside the stage): the values cannot tell.
        let before = record("h", &[1.0, 2.0, 3.0], 3);
        let out = [f32::NEG_INFINITY, -1.0];
        let e = forward(
            &[before.clone(), declared("z", OpKind::Log, &out, 2)],
            1,
            &[],
        )
        .unwrap();
        assert_eq!(
            (e.pattern, e.by_name),
            (Pattern::LogOfZero, false),
            "{}",
            e.sentence
        );
        let e = forward(&[before.clone(), record("log_probs", &out, 2)], 1, &[]).unwrap();
        assert_eq!(
            (e.pattern, e.by_name),
            (Pattern::LogOfZero, true),
            "{}",
            e.sentence
        );
        assert!(e.sentence.contains("read from its name"), "{}", e.sentence);
        // `logits` is no log: its name is not read as one.
        let e = forward(&[before.clone(), record("logits", &out, 2)], 1, &[]).unwrap();
        assert!(
            e.pattern != Pattern::LogOfZero && !e.by_name,
            "{}",
            e.sentence
        );
        // An exp declared as such that overflows is no accumulation, whatever
        // the record before it holds (exp(50·z) with z recorded).
        let e = forward(
            &[before, declared("act", OpKind::Exp, &[INF, 1.0], 2)],
            1,
            &[],
        )
        .unwrap();
        assert_eq!(e.pattern, Pattern::ExpOverflow, "{}", e.sentence);
    }

    #[test]
    fn element_and_row_patterns_are_told_apart() {
        // Zeros in rows that are not all zeros: 0/0, not a zero norm.
        let x = record("x", &[0.0, 1.0, 1.0, 0.0], 2);
        let y = record("ratio", &[f32::NAN, 1.0, 1.0, f32::NAN], 2);
        let e = forward(&[x, y], 1, &[]).unwrap();
        assert_eq!(e.pattern, Pattern::ZeroOverZero, "{}", e.sentence);
        let x = record("x", &[0.0, 1.0, 0.0, 0.0], 2);
        let y = record("norm", &[0.0, 1.0, f32::NAN, f32::NAN], 2);
        let e = forward(&[x, y], 1, &[]).unwrap();
        assert_eq!(
            (e.pattern, e.count),
            (Pattern::ZeroNormRow, 1),
            "{}",
            e.sentence
        );
        assert!(e.sentence.contains("1 row of the batch"), "{}", e.sentence);
    }

    #[test]
    fn an_exp_must_account_for_every_infinity_or_it_is_an_accumulation() {
        let x = record("x", &[100.0, 1.0], 2);
        let e = forward(&[x.clone(), record("act", &[INF, 2.7], 2)], 1, &[]).unwrap();
        assert_eq!(e.pattern, Pattern::ExpOverflow);
        // Both outputs infinite, one input below ln(max): a product's overflow.
        let e = forward(&[x, record("mix", &[INF, INF], 2)], 1, &[]).unwrap();
        assert_eq!(e.pattern, Pattern::AccumulationOverflow, "{}", e.sentence);
    }

    #[test]
    fn a_mask_of_minus_infinity_hands_the_explanation_to_the_softmax_after_it() {
        let masked = record("attn.masked", &[-INF, -INF, 1.0, -INF], 2);
        let soft = record("attn.softmax", &[f32::NAN, f32::NAN, 1.0, 0.0], 2);
        let e = forward(&[masked, soft], 0, &[]).unwrap();
        assert_eq!(
            (e.pattern, e.stage.as_str(), e.count),
            (Pattern::MaskedRow, "attn.softmax", 1)
        );
    }

    #[test]
    fn compositions_inside_one_stage_are_told_with_true_numbers() {
        // target · log(p) in one statement: p has exact zeros, the loss NaN.
        let p = record("probs", &[0.0, 1.0, 0.25, 0.75], 2);
        let loss = declared("loss", OpKind::Loss, &[f32::NAN], 1);
        let e = forward(&[p.clone(), loss], 1, &[]).unwrap();
        assert_eq!(
            (e.pattern, e.count),
            (Pattern::ZeroTimesLogOfZero, 1),
            "{}",
            e.sentence
        );
        assert!(
            e.sentence
                .contains("1 of 4 values exactly 0 (the others at least 2.500e-1)"),
            "{}",
            e.sentence
        );
        // Element-wise under a log, the same NaN is no 0/0.
        let xlogx = declared("xlogx", OpKind::Log, &[f32::NAN, 0.0, -0.3466, -0.2158], 2);
        let e = forward(&[p, xlogx], 1, &[]).unwrap();
        assert_eq!(e.pattern, Pattern::ZeroTimesLogOfZero, "{}", e.sentence);
        // log(softmax(z)) on logits 200 apart: the softmax underflows in f32.
        let z = record("logits", &[200.0, 0.0, 1.0, 2.0], 2);
        let nll = declared("nll", OpKind::Loss, &[f32::INFINITY], 1);
        let e = forward(&[z, nll], 1, &[]).unwrap();
        assert_eq!(
            (e.pattern, e.count),
            (Pattern::LogOfUnderflowedSoftmax, 1),
            "{}",
            e.sentence
        );
        assert!(
            e.sentence.contains("1 of 2 rows span more than 103.3"),
            "{}",
            e.sentence
        );
        // exp(50·z) with z recorded: z is at most 2.806, no input above 88.7.
        let z = record("z", &[2.806, 0.5], 2);
        let act = declared("act", OpKind::Exp, &[INF, 1e10], 2);
        let e = forward(&[z, act], 1, &[]).unwrap();
        assert_eq!(e.pattern, Pattern::ExpOfScaledInput, "{}", e.sentence);
        assert!(
            e.sentence
                .contains("at most 2.8060, so the stage multiplies it by at least 31.6"),
            "{}",
            e.sentence
        );
        // A batch norm without eps over a column constant across the batch.
        let h = record("h", &[1.0, 3.0, 2.0, 3.0, 5.0, 3.0], 2);
        let bn = declared(
            "bn",
            OpKind::Norm,
            &[-1.0, f32::NAN, 0.0, f32::NAN, 1.0, f32::NAN],
            2,
        );
        let e = forward(&[h, bn], 1, &[]).unwrap();
        assert_eq!(
            (e.pattern, e.count),
            (Pattern::ConstantNormalized, 1),
            "{}",
            e.sentence
        );
        assert!(
            e.sentence.contains("column 1 holds 3 in all 3 rows"),
            "{}",
            e.sentence
        );
    }

    #[test]
    fn gates_masks_inside_shifted_ratios_and_zero_divisors_are_told_with_their_repairs() {
        use crate::finding::Substitute;
        // log(1 - gate) with the gate rounded to exactly 1.
        let gate = record("gate", &[1.0, 0.5, 0.25, 1.0], 2);
        let loss = declared("bce", OpKind::Loss, &[-INF, 0.69, 0.29, f32::NAN], 2);
        let e = forward(&[gate, loss], 1, &[]).unwrap();
        assert_eq!(
            (e.pattern, e.count),
            (Pattern::SaturatedGate, 2),
            "{}",
            e.sentence
        );
        assert!(e.sentence.contains("above 16.6"), "{}", e.sentence);
        assert!(matches!(
            e.formulation.map(|f| f.substitute),
            Some(Substitute::ClampRange { .. })
        ));
        // A mask added inside the softmax: finite scores, a whole NaN row.
        let scores = record("scores", &[1.0, 2.0, 0.5, 0.1], 2);
        let soft = declared("soft", OpKind::Softmax, &[f32::NAN, f32::NAN, 0.6, 0.4], 2);
        let e = forward(&[scores, soft], 1, &[]).unwrap();
        assert_eq!(e.pattern, Pattern::MaskInsideSoftmax, "{}", e.sentence);
        assert!(e.sentence.contains("1 of its 2 rows"), "{}", e.sentence);
        // c[i+1]/c[i] of a product that underflowed: 0/0 where both are 0.
        let c = record("c", &[0.5, 0.0, 0.0, 0.25, 0.125, 0.0], 3);
        let ratio = record("ratio", &[0.0, f32::NAN, 0.5, 0.0], 2);
        let e = forward(&[c, ratio], 1, &[]).unwrap();
        assert_eq!(
            (e.pattern, e.count),
            (Pattern::ShiftedRatio, 1),
            "{}",
            e.sentence
        );
        assert_eq!(
            e.formulation.map(|f| f.substitute),
            Some(Substitute::ShiftedRatioEps { dim: 1, eps: 1e-8 })
        );
        // t / p with p exactly 0: +inf.
        let p = record("p", &[0.0, 1.0], 2);
        let kl = declared("kl", OpKind::Loss, &[INF, 0.1], 2);
        let e = forward(&[p, kl], 1, &[]).unwrap();
        assert_eq!(e.pattern, Pattern::DivisionByZero, "{}", e.sentence);
    }

    #[test]
    fn a_root_of_a_sum_of_squares_at_zero_is_its_own_backward_pattern() {
        let pairs = record("pairs", &[0.0, 0.0, 3.0, 4.0], 2);
        let m = Tensor::new(&[0f32, 5.0], &Device::Cpu).unwrap();
        let modulus = Record {
            name: "modulus".into(),
            op: None,
            grad_probe: Var::zeros(m.shape(), m.dtype(), m.device()).unwrap(),
            output: m,
            site: None,
            inputs: Vec::new(),
        };
        let grad = Tensor::new(&[[f32::NAN, f32::NAN], [0.6, 0.8]], &Device::Cpu).unwrap();
        let e = backward(&[pairs, modulus], 1, 0, &grad).unwrap();
        assert_eq!(
            (e.pattern, e.count),
            (Pattern::RootOfReducedZero, 1),
            "{}",
            e.sentence
        );
        assert!(e.sentence.contains("1 row of `pairs`"), "{}", e.sentence);
        assert!(e.formulation.is_some());
    }

    #[test]
    fn an_infinite_gradient_away_from_zeros_is_a_backward_overflow() {
        let records = [record("a", &[1.0, 2.0], 2), record("b", &[3.0, 0.0], 2)];
        let grad = Tensor::new(&[[INF, 1.0]], &Device::Cpu).unwrap();
        let e = backward(&records, 1, 0, &grad).unwrap();
        assert_eq!(e.pattern, Pattern::BackwardOverflow, "{}", e.sentence);
        // At the output's exact zero instead: the slope of a root at 0.
        let grad = Tensor::new(&[[1.0, f32::NAN]], &Device::Cpu).unwrap();
        let e = backward(&records, 1, 0, &grad).unwrap();
        assert_eq!(e.pattern, Pattern::InfiniteSlopeAtZero, "{}", e.sentence);
    }
}
