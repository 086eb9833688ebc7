//! What a rule reads of the op graph: values of the tensors an op read and
//! made, aligned position by position; the ops that made them, followed
//! back through views and stages; the user's words for a tensor (the
//! expression that made it, at its line); and why a tensor is exactly 0
//! where it is — the walk that turns "0/0" into "every entry of this row
//! of `h.relu()` is 0".

use crate::error::Result;
use crate::finding::{Explanation, OpKind, OpSite, Pattern};
use crate::models::graph::{OpGraph, Read};
use crate::spec::{dtype_max, smallest_positive};
use candle_core::{DType, Tensor};

/// A rule's view of a traced step: the graph, and the model's inputs (what
/// the first ops may have read).
pub struct Cx<'g, 'r> {
    pub g: &'g OpGraph<'r>,
    pub inputs: &'g [&'g Tensor],
}

/// A tensor's values as f64, flattened.
pub fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?)
}

/// `t`'s values broadcast to `like`'s shape (a bias read by a broadcast
/// op), or `None` when it does not broadcast to it.
pub fn aligned(t: &Tensor, like: &Tensor) -> Result<Option<Vec<f64>>> {
    if t.dims() == like.dims() {
        return Ok(Some(values(t)?));
    }
    match t.broadcast_as(like.shape()) {
        Ok(b) => Ok(Some(values(&b)?)),
        Err(_) => Ok(None),
    }
}

/// The largest finite value and the smallest positive one of a dtype,
/// and ln of the largest (where exp overflows).
#[derive(Clone, Copy)]
pub struct Range {
    pub max: f64,
    pub tiny: f64,
    pub ln_max: f64,
    pub dtype: DType,
}

impl Range {
    pub fn of(dtype: DType) -> Range {
        let max = dtype_max(dtype);
        Range {
            max,
            tiny: smallest_positive(dtype),
            ln_max: max.ln(),
            dtype,
        }
    }

    /// The dtype as users write it: `f32`, `f16`.
    pub fn name(&self) -> String {
        format!("{:?}", self.dtype).to_lowercase()
    }
}

/// "1 value", "3 values".
pub fn counted(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// "is" for one, "are" for more.
pub fn are(n: usize) -> &'static str {
    if n == 1 {
        "is"
    } else {
        "are"
    }
}

/// A number in a sentence: 4 significant digits, exponent past 1e4.
pub fn num(v: f64) -> String {
    if v == 0.0 || v.is_nan() || v.is_infinite() {
        return format!("{v}");
    }
    if v.fract() == 0.0 && v.abs() < 1e6 {
        return format!("{v}");
    }
    if (1e-3..1e4).contains(&v.abs()) {
        let s = format!("{v:.4}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{v:.3e}")
    }
}

impl<'g, 'r> Cx<'g, 'r> {
    pub fn site(&self, i: usize) -> Option<&'r OpSite> {
        self.g.records[i].site.as_ref()
    }

    pub fn kind(&self, i: usize) -> Option<OpKind> {
        self.g.records[i].op
    }

    pub fn output(&self, i: usize) -> &'r Tensor {
        &self.g.records[i].output
    }

    /// The tensors op `i` read.
    pub fn reads(&self, i: usize) -> Vec<Read<'r>> {
        self.g.reads(i)
    }

    /// The op that made what `read` holds, through stages recorded by name
    /// that only pass an op's output on.
    pub fn maker(&self, read: &Read) -> Result<Option<usize>> {
        match read.from {
            Some(j) => Ok(Some(self.g.source(j)?)),
            None => Ok(None),
        }
    }

    /// The op that made `read`, looking through views (reshapes, slices,
    /// broadcasts), with its kind.
    pub fn maker_through_views(&self, read: &Read) -> Result<Option<(usize, OpKind)>> {
        let mut at = self.maker(read)?;
        while let Some(j) = at {
            let Some(kind) = self.kind(j) else {
                return Ok(None);
            };
            // Adding an eps of 0 changes no value: look through it too.
            let adds_zero = matches!(kind, OpKind::Add | OpKind::Sub)
                && self.g.scalars(j) == [0.0]
                && self.reads(j).len() == 1;
            if (kind != OpKind::View && !adds_zero) || self.site(j).is_none() {
                return Ok(Some((j, kind)));
            }
            let reads = self.reads(j);
            let Some(first) = reads.first() else {
                return Ok(Some((j, kind)));
            };
            at = self.maker(first)?;
        }
        Ok(None)
    }

    /// The user's words for what `read` holds: the expression that made it
    /// and its line, the stage, the model's input, or a tensor no recorded
    /// op made.
    pub fn name(&self, read: &Read) -> Result<String> {
        if let Some(j) = self.maker(read)? {
            return Ok(self.name_of(j));
        }
        if self.inputs.iter().any(|t| t.id() == read.tensor.id()) {
            return Ok("the model's input".into());
        }
        Ok(if read.tensor.is_variable() {
            "a trainable tensor".into()
        } else {
            "a tensor from outside the instrumented code (the batch, a parameter, a gradient or a constant)".into()
        })
    }

    /// The user's words for record `j`'s output.
    pub fn name_of(&self, j: usize) -> String {
        match self.site(j) {
            Some(s) => format!("`{}` (line {})", s.short_text(48), s.line),
            None => format!("`{}`", self.g.records[j].name),
        }
    }

    /// The explanation of op `i` with `pattern`, its sentence and repair.
    pub fn explained(
        &self,
        i: usize,
        pattern: Pattern,
        count: usize,
        input: Option<&Read>,
        sentence: String,
        repair: String,
    ) -> Result<Explanation> {
        let r = &self.g.records[i];
        let input_site = match input {
            Some(read) => self.maker(read)?.and_then(|j| self.site(j).cloned()),
            None => None,
        };
        Ok(Explanation {
            pattern,
            stage: r.name.clone(),
            input: match input {
                Some(read) => Some(self.name(read)?),
                None => None,
            },
            input_site,
            count,
            by_name: false,
            sentence,
            repair,
            formulation: None,
            site: r.site.clone(),
            rewrite: None,
        })
    }

    /// How op `i` is named at the start of a sentence: "the log `p.log()`
    /// at model.rs:12:9" (or the stage's name).
    pub fn subject(&self, i: usize) -> String {
        match self.site(i) {
            Some(s) => format!(
                "the {} `{}` at {}",
                op_word(&s.op),
                s.short_text(60),
                s.location()
            ),
            None => format!("`{}`", self.g.records[i].name),
        }
    }

    /// Why `read` is exactly 0 at the flagged positions of `at` (aligned
    /// with `read`'s values), in words, following the op that made it: a
    /// ReLU's negative inputs, a softmax that underflowed, 1 − a gate that
    /// rounded to 1, a root or a mean of squares of a zero row, a sum of
    /// zeros. `None` when no op made it or none of these tells.
    pub fn why_zero(&self, read: &Read, at: &[bool]) -> Result<Option<Zero>> {
        let _ = at;
        self.why_zero_in(read, 4)
    }

    /// [`Cx::why_zero`], following at most `depth` more ops back.
    fn why_zero_in(&self, read: &Read, depth: usize) -> Result<Option<Zero>> {
        if depth == 0 {
            return Ok(None);
        }
        let Some((j, kind)) = self.maker_through_views(read)? else {
            return Ok(None);
        };
        // Why what op `j` read is 0 too, in parentheses.
        let inner = |k: usize| -> Result<String> {
            Ok(match self.reads(j).get(k) {
                Some(r) => match self.why_zero_in(r, depth - 1)? {
                    Some(z) => format!(" ({})", z.why),
                    None => format!(", and {} is 0 there", self.name(r)?),
                },
                None => String::new(),
            })
        };
        let name = self.name_of(j);
        let reads = self.reads(j);
        let gate = match kind {
            OpKind::Sub | OpKind::Mul => saturated_gate(self, j)?,
            _ => None,
        };
        let zero = match kind {
            OpKind::Activation if self.site(j).is_some_and(|s| s.op == "relu") => Zero {
                why: format!("{name} is a ReLU, 0 wherever its input is at or below 0"),
                cause: ZeroCause::Relu,
            },
            OpKind::Softmax => match reads.first() {
                Some(z) => match underflow(self, z)? {
                    Some(u) => Zero {
                        why: format!("{name} is a softmax that underflowed: {u}"),
                        cause: ZeroCause::UnderflowedSoftmax(j),
                    },
                    None => return Ok(None),
                },
                None => return Ok(None),
            },
            OpKind::Sigmoid => {
                let z = reads
                    .first()
                    .map(|z| values(z.tensor))
                    .transpose()?
                    .unwrap_or_default();
                let lo = z.iter().copied().fold(f64::INFINITY, f64::min);
                Zero {
                    why: format!(
                        "{name} is a sigmoid, which rounds to exactly 0 in {} for logits this low (down to {})",
                        Range::of(self.output(j).dtype()).name(),
                        num(lo)
                    ),
                    cause: ZeroCause::SaturatedGate(reads.first().and_then(|r| r.from)),
                }
            }
            // 1 − g (or g·(−1) + 1) of a gate that rounded to 1.
            OpKind::Sub | OpKind::Mul if gate.is_some() => {
                let (why, logits) = gate.expect("matched");
                Zero {
                    why,
                    cause: ZeroCause::SaturatedGate(logits),
                }
            }
            OpKind::Sub => Zero {
                why: format!("{name} subtracts equal values there"),
                cause: ZeroCause::Other,
            },
            OpKind::Sqrt | OpKind::Reduce => match zero_rows(self, j)? {
                Some(z) => z,
                None if kind == OpKind::Reduce => {
                    let mut why = format!("{name} sums entries that are all 0 there");
                    if let Some(inner) = reads
                        .first()
                        .map(|r| self.why_zero(r, &[]))
                        .transpose()?
                        .flatten()
                    {
                        why.push_str(&format!(" ({})", inner.why));
                    }
                    Zero {
                        why,
                        cause: ZeroCause::Other,
                    }
                }
                None if kind == OpKind::Sqrt => Zero {
                    why: format!("{name} is the root of what is 0 there{}", inner(0)?),
                    cause: ZeroCause::Other,
                },
                None => return Ok(None),
            },
            OpKind::Add if reads.len() == 2 => {
                let mut parts = Vec::new();
                for r in &reads {
                    if let Some(inner) = self.why_zero_in(r, depth - 1)? {
                        parts.push(inner.why);
                    }
                }
                if parts.is_empty() {
                    return Ok(None);
                }
                Zero {
                    why: format!(
                        "{name} adds two terms that are both 0 there: {}",
                        parts.join("; ")
                    ),
                    cause: ZeroCause::Other,
                }
            }
            OpKind::Exp => {
                let x = reads
                    .first()
                    .map(|r| values(r.tensor))
                    .transpose()?
                    .unwrap_or_default();
                let masked = x.iter().filter(|&&v| v == f64::NEG_INFINITY).count();
                let tiny = Range::of(self.output(j).dtype()).tiny.ln();
                Zero {
                    why: if masked > 0 {
                        format!(
                            "{name} is exp of −inf (a mask) in {}, exactly 0",
                            counted(masked, "value")
                        )
                    } else {
                        format!("{name} underflows to exactly 0 where its input is below {tiny:.1}")
                    },
                    cause: ZeroCause::Other,
                }
            }
            // A square of zeros, a scaled zero, a zero numerator, a root of 0.
            OpKind::Mul if self.site(j).is_some_and(|s| s.op == "sqr") => Zero {
                why: format!("{name} squares what is 0 there{}", inner(0)?),
                cause: ZeroCause::Other,
            },
            OpKind::Mul if !self.g.scalars(j).is_empty() && reads.len() == 1 => Zero {
                why: format!("{name} scales what is 0 there{}", inner(0)?),
                cause: ZeroCause::Other,
            },
            OpKind::Mul => {
                // The factor that is 0 there, followed back; else an underflow.
                let zero_factor = reads
                    .iter()
                    .position(|r| values(r.tensor).is_ok_and(|v| v.contains(&0.0)));
                match zero_factor {
                    Some(k) => Zero {
                        why: format!("{name} multiplies by a factor that is 0 there{}", inner(k)?),
                        cause: ZeroCause::Other,
                    },
                    None => Zero {
                        why: format!("{name} is a product that underflowed to 0"),
                        cause: ZeroCause::Other,
                    },
                }
            }
            OpKind::Pow if self.g.scalars(j).first().is_some_and(|p| *p > 0.0) => Zero {
                why: format!(
                    "{name} raises what is 0 there to a positive power{}",
                    inner(0)?
                ),
                cause: ZeroCause::Other,
            },
            OpKind::Abs => Zero {
                why: format!("{name} is the magnitude of what is 0 there{}", inner(0)?),
                cause: ZeroCause::Other,
            },
            OpKind::Variance => match reads.first() {
                Some(x) => match constant_lines(self, x)? {
                    Some(words) => Zero {
                        why: format!("{name} is a variance: {words}"),
                        cause: ZeroCause::Constant,
                    },
                    None => return Ok(None),
                },
                None => return Ok(None),
            },
            OpKind::Div if !reads.is_empty() && self.site(j).is_some_and(|s| s.op != "recip") => {
                Zero {
                    why: format!("{name} divides what is 0 there{}", inner(0)?),
                    cause: ZeroCause::Other,
                }
            }
            _ => return Ok(None),
        };
        Ok(Some(zero))
    }
}

/// An op's method, function or operator as a noun (`*` is a product).
pub fn op_word(op: &str) -> &str {
    match op {
        "+" => "sum",
        "-" => "difference",
        "*" => "product",
        "/" => "quotient",
        other => other,
    }
}

/// Why a tensor is 0, in words, and what it is.
pub struct Zero {
    pub why: String,
    pub cause: ZeroCause,
}

/// The op behind a zero, as the rules branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroCause {
    Relu,
    /// A softmax (the record) whose exp underflowed.
    UnderflowedSoftmax(usize),
    /// 1 − a gate that rounded to 1 (the gate's logits: the record).
    SaturatedGate(Option<usize>),
    /// A root or a mean or sum of squares over rows that are all 0.
    ZeroRows,
    /// A standard deviation over a column (or a row) that is constant.
    Constant,
    Other,
}

/// The rows of a softmax's input that span more than −ln(tiny) from their
/// largest to their smallest entry: exp underflows to exactly 0 there.
pub fn underflow(cx: &Cx, z: &Read) -> Result<Option<String>> {
    let width = *z.tensor.dims().last().unwrap_or(&1);
    if width < 2 {
        return Ok(None);
    }
    let reach = -Range::of(z.tensor.dtype()).tiny.ln();
    let x = values(z.tensor)?;
    let spreads: Vec<f64> = x
        .chunks(width)
        .map(|row| {
            let (lo, hi) = row
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                });
            hi - lo
        })
        .collect();
    let rows = spreads.iter().filter(|&&d| d > reach).count();
    let widest = spreads.iter().copied().fold(0.0, f64::max);
    Ok((rows > 0).then(|| {
        format!(
            "{rows} of the {} rows of {} span more than {reach:.1} from their largest to their smallest entry (up to {}), so exp of their smallest entries is exactly 0",
            spreads.len(),
            cx.name(z).unwrap_or_default(),
            num(widest)
        )
    }))
}

/// `1 − g` (op `j`, a subtraction of a gate from 1) where `g` is a sigmoid
/// that rounded to exactly 1: the words, and the gate's logits' record.
/// Whether op `j` is 1 − g: `1.0 - g`, or g·(−1) + 1 (`affine(-1.0, 1.0)`).
pub fn one_minus(cx: &Cx, j: usize) -> bool {
    match cx.site(j).map(|s| s.op.as_str()) {
        Some("affine") => cx.g.scalars(j) == [-1.0, 1.0],
        Some("-") => matches!(cx.args(j).first(), Some(Arg::Scalar(v)) if *v == 1.0),
        _ => false,
    }
}

fn saturated_gate(cx: &Cx, j: usize) -> Result<Option<(String, Option<usize>)>> {
    if !one_minus(cx, j) {
        return Ok(None);
    }
    let reads = cx.reads(j);
    let Some(g) = reads.first() else {
        return Ok(None);
    };
    let Some((k, kind)) = cx.maker_through_views(g)? else {
        return Ok(None);
    };
    let hand_written = kind == OpKind::Div && cx.site(k).is_some_and(|s| s.op == "recip");
    if !matches!(kind, OpKind::Sigmoid | OpKind::Softmax) && !hand_written {
        return Ok(None);
    }
    let ones = values(g.tensor)?.iter().filter(|&&v| v == 1.0).count();
    if ones == 0 {
        return Ok(None);
    }
    let dt = Range::of(g.tensor.dtype());
    let edge = (2.0 / crate::spec::machine_epsilon(g.tensor.dtype())).ln();
    let logits = cx
        .reads(k)
        .first()
        .and_then(|r| r.from)
        .filter(|_| kind == OpKind::Sigmoid);
    let gate = match kind {
        OpKind::Softmax => {
            "a softmax, which rounds to exactly 1 where one logit leads the others by enough"
                .to_string()
        }
        _ => format!(
            "a sigmoid that rounds to exactly 1 in {} for logits above {edge:.1}",
            dt.name()
        ),
    };
    Ok(Some((
        format!(
            "{} is 1 − {}, {gate}: it is exactly 1 in {}, so 1 − it is 0 there",
            cx.name_of(j),
            cx.name_of(k),
            counted(ones, "value")
        ),
        logits,
    )))
}

/// A root, a mean or a sum of squares (op `j`) that is 0 on whole rows
/// because the rows it reduced are all 0, or because they are constant
/// (a standard deviation: the squares of a centered row).
fn zero_rows(cx: &Cx, j: usize) -> Result<Option<Zero>> {
    // Through the root to the reduction, through the reduction to the squares.
    let mut at = j;
    if cx.kind(at) == Some(OpKind::Sqrt) {
        let Some(r) = cx.reads(at).first().copied() else {
            return Ok(None);
        };
        let Some((k, _)) = cx.maker_through_views(&r)? else {
            return Ok(None);
        };
        at = k;
    }
    if cx.kind(at) != Some(OpKind::Reduce) {
        return Ok(None);
    }
    let Some(squares) = cx.reads(at).first().copied() else {
        return Ok(None);
    };
    let Some(sq) = cx.maker(&squares)? else {
        return Ok(None);
    };
    if cx.kind(sq) != Some(OpKind::Mul) {
        return Ok(None);
    }
    let Some(x) = cx.reads(sq).first().copied() else {
        return Ok(None);
    };
    // A centered tensor (x − mean(x)): its zeros are a constant column.
    if let Some(c) = cx.maker(&x)? {
        if cx.kind(c) == Some(OpKind::Sub) {
            if let Some(orig) = cx.reads(c).first().copied() {
                if let Some(words) = constant_lines(cx, &orig)? {
                    return Ok(Some(Zero {
                        why: words,
                        cause: ZeroCause::Constant,
                    }));
                }
            }
        }
    }
    let width = *x.tensor.dims().last().unwrap_or(&1);
    let xs = values(x.tensor)?;
    let zero = xs
        .chunks(width.max(1))
        .filter(|r| r.iter().all(|&v| v == 0.0))
        .count();
    if zero == 0 {
        return Ok(None);
    }
    let mut why = format!(
        "{} reduces squares of {}, and {} of its {} rows {} all zeros",
        cx.name_of(at),
        cx.name(&x)?,
        zero,
        xs.len() / width.max(1),
        if zero == 1 { "is" } else { "are" }
    );
    if let Some(z) = cx.why_zero(&x, &[])? {
        why.push_str(&format!(" ({})", z.why));
    }
    Ok(Some(Zero {
        why,
        cause: ZeroCause::ZeroRows,
    }))
}

/// The columns (across the batch) or rows of `x` that are constant, in
/// words with their value, if any.
pub fn constant_lines(cx: &Cx, x: &Read) -> Result<Option<String>> {
    let dims = x.tensor.dims();
    let width = *dims.last().unwrap_or(&1);
    let xs = values(x.tensor)?;
    if width == 0 || xs.is_empty() {
        return Ok(None);
    }
    let rows = xs.len() / width;
    let cols: Vec<usize> = (0..width)
        .filter(|&j| rows > 1 && (0..rows).all(|r| xs[r * width + j] == xs[j]))
        .collect();
    if let Some(&j) = cols.first() {
        return Ok(Some(format!(
            "column {j} of {} holds {} in all {rows} rows ({} constant across the batch), so its standard deviation is exactly 0",
            cx.name(x)?,
            num(xs[j]),
            counted(cols.len(), "column")
        )));
    }
    let constant_rows: Vec<usize> = (0..rows)
        .filter(|&r| {
            let row = &xs[r * width..(r + 1) * width];
            width > 1 && row.iter().all(|&v| v == row[0])
        })
        .collect();
    Ok(constant_rows.first().map(|&r| {
        format!(
            "row {r} of {} holds {} in all {width} positions ({} constant), so its standard deviation is exactly 0",
            cx.name(x).unwrap_or_default(),
            num(xs[r * width]),
            counted(constant_rows.len(), "row")
        )
    }))
}

/// An operand of an op in its written order: a tensor (what made it), or
/// a number.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'r> {
    Tensor(Read<'r>),
    Scalar(f64),
}

impl<'g, 'r> Cx<'g, 'r> {
    /// Op `i`'s operands in their written order.
    pub fn args(&self, i: usize) -> Vec<Arg<'r>> {
        use crate::instrument::Operand;
        let r = &self.g.records[i];
        if r.site.is_none() {
            return self.reads(i).into_iter().map(Arg::Tensor).collect();
        }
        let mut out = Vec::new();
        for o in &r.inputs {
            match o {
                Operand::Tensor(t) => out.push(Arg::Tensor(Read {
                    tensor: t,
                    from: self.g.made(t),
                })),
                Operand::Tensors(ts) => out.extend(ts.iter().map(|t| {
                    Arg::Tensor(Read {
                        tensor: t,
                        from: self.g.made(t),
                    })
                })),
                Operand::Scalar(v) => out.push(Arg::Scalar(*v)),
            }
        }
        out
    }

    /// An operand's values aligned with `like` (a number repeated).
    pub fn arg_values(&self, a: &Arg, like: &Tensor) -> Result<Option<Vec<f64>>> {
        match a {
            Arg::Tensor(r) => aligned(r.tensor, like),
            Arg::Scalar(v) => Ok(Some(vec![*v; like.elem_count()])),
        }
    }

    /// An operand in the user's words.
    pub fn arg_name(&self, a: &Arg) -> Result<String> {
        match a {
            Arg::Tensor(r) => self.name(r),
            Arg::Scalar(v) => Ok(format!("the number {}", num(*v))),
        }
    }
}
