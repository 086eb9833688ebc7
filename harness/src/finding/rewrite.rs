//! A repair of one op of the user's code as the developer would write it:
//! the op's expression replaced by its stable form ([`RewriteForm`]), as data the
//! tracer substitutes at the op for a whole run (the tensor arithmetic
//! lives with the intervention) and as a diff of the user's source line
//! ([`LineDiff`]) whose `+` line compiles in place.
//!
//! The code is built from the operands' text as the attribute recorded it
//! ([`OpSite::operands`]), so it names the user's own variables; a form
//! that needs what another op read (the logits of a softmax whose log is
//! taken) is offered only where that op is in the same function.

use super::OpSite;
use crate::spec::HalfType;
use serde::{Deserialize, Serialize};

/// What replaces an op's expression.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "form", rename_all = "snake_case")]
pub enum RewriteForm {
    /// log(softmax(z)) → log_softmax(z): the log of the softmax at `from`
    /// (or of exp(z) / Σ exp(z), the exp at `from`).
    LogSoftmax,
    /// f(x) → f(x + eps): a root or a fractional power at 0 (its slope),
    /// a log of exact zeros that a 0 multiplies (0·log(eps) is 0).
    OperandPlusEps {
        /// Added to the operand.
        eps: f64,
    },
    /// f(x) → f(max(x, floor)): a log of a value that rounds to 0 (1 − a
    /// gate saturated to exactly 1).
    OperandFloor {
        /// The operand's floor.
        floor: f64,
    },
    /// a / b → a / max(b, floor): a count or a norm in the denominator.
    DenominatorFloor {
        /// The denominator's floor.
        floor: f64,
    },
    /// exp(x) → exp(x − max(x)) over the last dimension: an exp whose
    /// output is normalized by its own sum (the ratio is unchanged).
    MaxSubtracted,
    /// x.to_dtype(half) → x clamped into ±limit first: a constant past
    /// the half dtype's range (a −1e9 mask) becomes a finite one that
    /// leaves room to add scores to it.
    ClampBeforeCast {
        /// The magnitude clamped to.
        limit: f64,
    },
    /// a − b → clamp(a) − clamp(b) into ±limit: infinities that cancel
    /// (a row's max subtracted from a row entirely −inf) become finite
    /// values that do (a finite mask value).
    FiniteOperands {
        /// The magnitude clamped to.
        limit: f64,
    },
    /// log(exp(x) + 1) → relu(x) + log(1 + exp(−|x|)): a softplus by hand
    /// whose exp overflows; `x` is what the exp at `from` read.
    Softplus,
    /// log(1 − σ(z)) → −softplus(z): the log of one minus a sigmoid (candle's
    /// or one by hand) taken from its logits `z`, what the op at `from`
    /// read; 1 − σ(z) rounds to 0 for large `z`, −softplus(z) never does.
    NegSoftplus,
    /// log(sum(exp(x))) → logsumexp(x) over the last dimension (the max
    /// subtracted inside); the log's expression is rewritten, `x` is what
    /// the exp at `from` read, and a keepdim sum's dimension is put back at
    /// `keepdim_at`.
    LogSumExp {
        /// Where a keepdim sum's dimension goes back.
        keepdim_at: Option<usize>,
    },
    /// exp(x) → exp(min(x, cap)): an exp that nothing normalizes, capped
    /// below the dtype's range (its slope is 0 past the cap).
    ClampedExp {
        /// The exp's input cap.
        cap: f64,
    },
    /// var(x) → mean((x − mean(x))²): the biased variance, 0 (not 0/0)
    /// over one value.
    BiasedVariance {
        /// The reduced dimension.
        dim: usize,
        /// Whether it is kept.
        keepdim: bool,
    },
    /// An op of a region of half-precision code computed in f32: a value
    /// past the half dtype's range (a sum of squares of values in the
    /// hundreds) kept in f32 from the op that overflowed to the first ops
    /// whose values fit the dtype again, cast back there. The region's
    /// entry is the rewrite, the ops after it its [`Rewrite::with`].
    Widened {
        /// Which operands (bit k: operand k, receiver first) are half
        /// precision and cast up: every tensor of the entry, those of
        /// the other ops that no op of the region made.
        cast: u8,
        /// The output cast back to this dtype: the region ends here.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        back: Option<HalfType>,
        /// The region's first op.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        entry: bool,
    },
}

/// A rewrite of the op at `site`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rewrite {
    /// The op rewritten.
    pub site: OpSite,
    /// How.
    pub form: RewriteForm,
    /// The op whose operands the rewrite reads, when it is not `site`
    /// (the softmax a log is taken of).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<OpSite>,
    /// What `from` read, as the rewritten line names it, where `from` is
    /// in another function (its own operand's text is in that one's
    /// scope): the name a `let` of the line's function bound it to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The other ops the same repair rewrites, where it is more than one
    /// op's (the ops of a region computed in f32 after its entry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<Rewrite>,
}

impl Rewrite {
    /// This rewrite's ops: itself, then those it rewrites [`Rewrite::with`].
    pub fn parts(&self) -> impl Iterator<Item = &Rewrite> {
        std::iter::once(self).chain(self.with.iter())
    }

    /// Whether the code is the op's own (an op of a region whose
    /// operands are all the region's: its line is not edited).
    fn unchanged(&self) -> bool {
        let squeeze = |t: &str| t.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        self.code()
            .is_some_and(|c| squeeze(&c) == squeeze(&self.site.text))
    }

    /// The expression that replaces the op's (`site.text`), or `None`
    /// when the operands' text is not on record.
    pub fn code(&self) -> Option<String> {
        let s = &self.site;
        let recv = s.operands.first()?;
        // A borrowed place is its own receiver (`p.log()` for `(&p).log()`).
        let recv = match is_place(recv) {
            true => recv.trim_start_matches('&'),
            false => recv,
        };
        let rest = s.operands.get(1..).unwrap_or_default().join(", ");
        let method = s.text.contains(&format!(".{}(", s.op));
        let call = |x: &str| format!("{}.{}({rest})", receiver(x), s.op);
        let code = match self.form {
            // A softmax by hand: the log_softmax of what its exp read.
            RewriteForm::LogSoftmax if self.from.as_ref()?.op == "exp" => {
                let x = self.from.as_ref()?.operands.first()?;
                let x = match is_place(x) {
                    true => format!("&{}", x.trim_start_matches('&')),
                    false => format!("&{}", receiver(x)),
                };
                format!("candle_nn::ops::log_softmax({x}, candle_core::D::Minus1)")
            }
            RewriteForm::LogSoftmax => {
                let from = self.from.as_ref()?;
                let head = from.text.strip_suffix(')')?;
                let at = head.rfind(&format!("{}(", from.op))?;
                let args = &from.operands;
                let dim = args.get(1).map_or("candle_core::D::Minus1", String::as_str);
                format!("{}log_softmax({}, {dim})", &from.text[..at], args.first()?)
            }
            RewriteForm::OperandPlusEps { .. } | RewriteForm::OperandFloor { .. } if !method => {
                return None
            }
            RewriteForm::OperandPlusEps { eps } => call(&format!("({recv} + {})?", lit(eps))),
            RewriteForm::OperandFloor { floor } => {
                call(&format!("{}.maximum({})?", receiver(recv), lit(floor)))
            }
            RewriteForm::DenominatorFloor { floor } => match (s.op.as_str(), s.operands.as_slice())
            {
                ("/", [l, r]) => format!("{l} / {}.maximum({})?", receiver(r), lit(floor)),
                ("recip", _) => call(&format!("{}.maximum({})?", receiver(recv), lit(floor))),
                (_, [a, b]) => {
                    let b = b.strip_prefix('&').unwrap_or(b);
                    format!(
                        "{}.{}(&{}.maximum({})?)",
                        receiver(a),
                        s.op,
                        receiver(b),
                        lit(floor)
                    )
                }
                _ => return None,
            },
            RewriteForm::MaxSubtracted => bound(recv, |x| {
                format!("{x}.broadcast_sub(&{x}.max_keepdim(candle_core::D::Minus1)?)?.exp()")
            }),
            RewriteForm::ClampBeforeCast { limit } => format!(
                "{}.clamp(-{l}, {l})?.to_dtype({rest})",
                receiver(recv),
                l = lit(limit)
            ),
            RewriteForm::Softplus => {
                let x = self.from.as_ref()?.operands.first()?;
                bound(x, softplus)
            }
            RewriteForm::NegSoftplus => {
                let x = match &self.input {
                    Some(name) => name,
                    None => self.from.as_ref()?.operands.first()?,
                };
                bound(x, |x| format!("{}?.neg()", softplus(x)))
            }
            RewriteForm::LogSumExp { keepdim_at } => {
                let x = self.from.as_ref()?.operands.first()?;
                // The sum's dimension, from the log's receiver `e.sum(D)?`.
                let sum = recv.strip_suffix(")?")?;
                let (_, dim) = sum
                    .rsplit_once(".sum_keepdim(")
                    .or_else(|| sum.rsplit_once(".sum("))?;
                let back = keepdim_at.map_or(String::new(), |k| format!("?.unsqueeze({k})"));
                format!("{}.log_sum_exp({dim}){back}", receiver(x))
            }
            RewriteForm::ClampedExp { cap } if method => {
                call(&format!("{}.minimum({})?", receiver(recv), lit(cap)))
            }
            RewriteForm::ClampedExp { .. } => return None,
            RewriteForm::FiniteOperands { limit } => {
                let clamp = |x: &str| format!("{}.clamp(-{l}, {l})?", receiver(x), l = lit(limit));
                match (s.op.as_str(), s.operands.as_slice()) {
                    ("-" | "+", [a, b]) => format!("{} {} {}", clamp(a), s.op, clamp(b)),
                    (_, [a, b]) if !method => return None,
                    (_, [a, b]) => format!(
                        "{}.{}(&{})",
                        clamp(a),
                        s.op,
                        clamp(b.strip_prefix('&').unwrap_or(b))
                    ),
                    _ => return None,
                }
            }
            RewriteForm::BiasedVariance { dim, keepdim } => {
                let mean = if keepdim { "mean_keepdim" } else { "mean" };
                bound(recv, |x| {
                    format!("{x}.broadcast_sub(&{x}.mean_keepdim({dim})?)?.sqr()?.{mean}({dim})")
                })
            }
            RewriteForm::Widened { cast, back, .. } => return widened_code(s, cast, back, method),
        };
        Some(code)
    }

    /// This rewrite with its eps (or floor) raised to `eps`, for a form
    /// that has one and a smaller one; `None` otherwise.
    pub fn with_eps(&self, eps: f64) -> Option<Rewrite> {
        let form = match self.form {
            RewriteForm::OperandPlusEps { eps: e } if e < eps => {
                RewriteForm::OperandPlusEps { eps }
            }
            RewriteForm::OperandFloor { floor } if floor < eps => {
                RewriteForm::OperandFloor { floor: eps }
            }
            RewriteForm::DenominatorFloor { floor } if floor < eps => {
                RewriteForm::DenominatorFloor { floor: eps }
            }
            _ => return None,
        };
        Some(Rewrite {
            form,
            ..self.clone()
        })
    }

    /// What the rewrite does, in words.
    pub fn describe(&self) -> String {
        match self.form {
            RewriteForm::LogSoftmax => "the log of a softmax as log_softmax".into(),
            RewriteForm::OperandPlusEps { eps } => {
                format!("{} of its input plus {}", self.site.op, lit(eps))
            }
            RewriteForm::OperandFloor { floor } => {
                format!("{} of its input floored at {}", self.site.op, lit(floor))
            }
            RewriteForm::DenominatorFloor { floor } => {
                format!("the denominator floored at {}", lit(floor))
            }
            RewriteForm::MaxSubtracted => "the exp of its input less the row's max".into(),
            RewriteForm::ClampBeforeCast { limit } => {
                format!("the values clamped into ±{} before the cast", lit(limit))
            }
            RewriteForm::Softplus => "a softplus that cannot overflow".into(),
            RewriteForm::NegSoftplus => {
                "log(1 − sigmoid(z)) as −softplus(z), which cannot round to log 0".into()
            }
            RewriteForm::LogSumExp { .. } => "the log of a sum of exps as logsumexp".into(),
            RewriteForm::ClampedExp { cap } => format!("the exp's input capped at {}", lit(cap)),
            RewriteForm::FiniteOperands { limit } => {
                format!("both operands clamped into ±{}", lit(limit))
            }
            RewriteForm::BiasedVariance { .. } => "the biased variance (0 over one value)".into(),
            RewriteForm::Widened { entry: true, .. } => self.region_words(),
            RewriteForm::Widened { back: Some(h), .. } => {
                format!("computed in f32, cast back to {}", h.dtype().as_str())
            }
            RewriteForm::Widened { .. } => "computed in f32".into(),
        }
    }

    /// A region's entry in words: where it ends, cast back.
    fn region_words(&self) -> String {
        let exits: Vec<String> = self
            .parts()
            .filter_map(|r| match r.form {
                RewriteForm::Widened { back: Some(h), .. } => Some(format!(
                    "`{}` ({})",
                    r.site.short_text(40),
                    h.dtype().as_str()
                )),
                _ => None,
            })
            .collect();
        format!(
            "computed in f32 from here, with the {} ops after it that read its values, cast back at {}",
            self.with.len(),
            exits.join(" and ")
        )
    }

    /// The diff of the op's source line, read from `site.file` (relative
    /// to the workspace the program runs in); where the file cannot be
    /// read or the expression is not on that one line, the diff of the
    /// expression alone.
    pub fn diff(&self) -> Option<LineDiff> {
        let code = self.code()?;
        let s = &self.site;
        let line = source_line(&s.file, s.line);
        let edited = line.as_deref().and_then(|l| edit(l, &s.text, &code));
        let (before, after, whole_line) = match (line, edited) {
            (Some(l), Some(after)) => {
                (l.trim_end().to_string(), after.trim_end().to_string(), true)
            }
            _ => (s.text.clone(), code, false),
        };
        Some(LineDiff {
            file: s.file.clone(),
            line: s.line,
            before,
            after,
            whole_line,
        })
    }
}

/// The diffs of a set of rewrites, one per source line: rewrites of
/// ops on the same line are applied to it together (right to left, so
/// each finds its expression where the line holds it).
pub fn line_diffs(rewrites: &[Rewrite]) -> Vec<LineDiff> {
    let mut out: Vec<LineDiff> = Vec::new();
    let mut sorted: Vec<&Rewrite> = rewrites
        .iter()
        .flat_map(Rewrite::parts)
        .filter(|r| !r.unchanged())
        .collect();
    sorted.sort_by_key(|r| std::cmp::Reverse(r.site.column));
    for r in sorted {
        let Some(d) = r.diff() else {
            continue;
        };
        match out.iter_mut().find(|o| {
            (o.file.as_str(), o.line) == (d.file.as_str(), d.line) && o.whole_line && d.whole_line
        }) {
            Some(o) => {
                // Apply this rewrite to the line as the others left it.
                let code = r.code().unwrap_or_default();
                if let Some(after) = edit(&o.after, &r.site.text, &code) {
                    o.after = after;
                }
            }
            None => out.push(d),
        }
    }
    out.sort_by(|a, b| (a.file.as_str(), a.line).cmp(&(b.file.as_str(), b.line)));
    out
}

/// Line `line` (1-based) of `file`, a path relative to the workspace
/// root as `file!()` gives it: looked for from the directory the program
/// runs in and the directories above it (a test runs in its crate's).
fn source_line(file: &str, line: u32) -> Option<String> {
    let here = std::env::current_dir().ok()?;
    let text = here
        .ancestors()
        .take(4)
        .find_map(|dir| std::fs::read_to_string(dir.join(file)).ok())?;
    text.lines()
        .nth(line.checked_sub(1)? as usize)
        .map(str::to_string)
}

/// A source line as written and as repaired.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LineDiff {
    /// The source file.
    pub file: String,
    /// The line.
    pub line: u32,
    /// The line as written.
    pub before: String,
    /// The line rewritten.
    pub after: String,
    /// `before` is the whole line as the file holds it; otherwise the
    /// op's expression alone (the file was not readable from here, or the
    /// expression spans lines).
    pub whole_line: bool,
}

impl std::fmt::Display for LineDiff {
    /// `--- file:line`, then `- before` and `+ after`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.whole_line {
            ""
        } else {
            " (the expression)"
        };
        writeln!(f, "--- {}:{}{what}", self.file, self.line)?;
        writeln!(f, "- {}", self.before.trim_start())?;
        write!(f, "+ {}", self.after.trim_start())
    }
}

/// A number as a Rust literal a developer writes (`1e-8`, `0.5`, `1e4`).
pub fn lit(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e4 {
        return format!("{v:.1}");
    }
    let (plain, sci) = (format!("{v}"), format!("{v:e}"));
    match (plain.len() <= sci.len(), plain.contains(['.', 'e'])) {
        (true, true) => plain,
        (true, false) => format!("{plain}.0"),
        (false, _) => sci,
    }
}

/// `x` as the receiver of a method call: a borrowed place as the place
/// (`p` for `&p`: the method borrows it), anything else parenthesized
/// unless it is a path, a call, a field or a `?` (what a method binds no
/// tighter than).
fn receiver(x: &str) -> String {
    if is_place(x) {
        return x.trim_start_matches('&').to_string();
    }
    let mut depth = 0i32;
    let loose = x.starts_with(['&', '*', '-', '!'])
        || x.chars().any(|c| {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            }
            depth == 0 && c == ' '
        });
    if loose {
        format!("({x})")
    } else {
        x.to_string()
    }
}

/// Whether operand text `x` names a place (`x`, `self.w`, `&p`): read
/// twice, it is the same tensor, and a method call on it borrows it.
pub fn is_place(x: &str) -> bool {
    let x = x.strip_prefix('&').unwrap_or(x);
    !x.is_empty()
        && x.starts_with(|c: char| c.is_alphabetic() || c == '_')
        && x.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
}

/// The softplus of place `x` that cannot overflow, as code (a `Result`).
fn softplus(x: &str) -> String {
    format!("(({x}.abs()?.neg()?.exp()? + 1.0)?.log()? + {x}.relu()?)")
}

/// `body` of operand `x`, which it reads twice: `x` itself where it is a
/// place, otherwise bound once in a block (a value read twice would be
/// computed, or moved, twice).
fn bound(x: &str, body: impl Fn(&str) -> String) -> String {
    match is_place(x) {
        true => body(x.strip_prefix('&').unwrap_or(x)),
        false => format!("{{ let x = {x}; {} }}", body("x")),
    }
}

/// `line` with op text `text` replaced by `code`; where the text spans
/// lines (a method chain), its tail after what the code keeps of it (the
/// receiver) replaced by the code's, where that tail is on the line once.
fn edit(line: &str, text: &str, code: &str) -> Option<String> {
    if let Some((a, b)) = locate(line, text) {
        return Some(format!("{}{code}{}", &line[..a], &line[b..]));
    }
    let kept = text
        .char_indices()
        .zip(code.chars())
        .find(|((_, t), c)| t != c)
        .map(|((i, _), _)| i)?;
    let (tail, new_tail) = (&text[kept..], &code[kept..]);
    let (a, b) = locate(line, tail)?;
    if tail.is_empty() || locate(&line[b..], tail).is_some() {
        return None;
    }
    Some(format!("{}{new_tail}{}", &line[..a], &line[b..]))
}

/// `x` (an operand's text) read in f32: `x.to_dtype(F32)?`, borrowed
/// again where it was borrowed.
fn in_f32(x: &str) -> String {
    const UP: &str = ".to_dtype(candle_core::DType::F32)?";
    match x.strip_prefix('&') {
        Some(rest) => format!("&{}{UP}", receiver(rest)),
        None => format!("{}{UP}", receiver(x)),
    }
}

/// The code of an op of a region computed in f32: the operands of
/// `cast` cast up, the output cast back to `back`.
fn widened_code(s: &OpSite, cast: u8, back: Option<HalfType>, method: bool) -> Option<String> {
    let ops = &s.operands;
    let up = |k: usize| match cast & (1 << k) != 0 {
        true => in_f32(&ops[k]),
        false => ops[k].clone(),
    };
    let args = |from: usize| (from..ops.len()).map(up).collect::<Vec<_>>().join(", ");
    let operator = matches!(s.op.as_str(), "+" | "-" | "*" | "/") && ops.len() == 2;
    let body = if operator {
        format!("{} {} {}", up(0), s.op, up(1))
    } else if method {
        let recv = match cast & 1 != 0 {
            true => in_f32(ops.first()?.trim_start_matches('&')),
            false => receiver(ops.first()?),
        };
        format!("{recv}.{}({})", s.op, args(1))
    } else {
        let head = s.text.strip_suffix(')')?;
        let at = head.rfind(&format!("{}(", s.op))?;
        format!("{}{}({})", &s.text[..at], s.op, args(0))
    };
    Some(match back {
        Some(h) if operator => format!("({body})?.to_dtype(candle_core::DType::{})", dtype_name(h)),
        Some(h) => format!("{body}?.to_dtype(candle_core::DType::{})", dtype_name(h)),
        None => body,
    })
}

/// A half dtype as candle's `DType` variant names it.
fn dtype_name(h: HalfType) -> &'static str {
    match h {
        HalfType::F16 => "F16",
        HalfType::Bf16 => "BF16",
    }
}

/// The byte range of `line` that holds `text`, spacing aside.
fn locate(line: &str, text: &str) -> Option<(usize, usize)> {
    let want: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    for start in 0..chars.len() {
        if chars[start].1.is_whitespace() {
            continue;
        }
        let (mut k, mut j) = (0, start);
        while j < chars.len() && k < want.len() {
            let c = chars[j].1;
            if c.is_whitespace() {
                j += 1;
            } else if c == want[k] {
                j += 1;
                k += 1;
            } else {
                break;
            }
        }
        if k == want.len() {
            let end = chars.get(j).map_or(line.len(), |&(b, _)| b);
            return Some((chars[start].0, end));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::OpKind;

    fn site(text: &str, op: &str, operands: &[&str], kind: OpKind) -> OpSite {
        OpSite {
            file: "nowhere.rs".into(),
            line: 1,
            column: 1,
            text: text.into(),
            operands: operands.iter().map(|s| s.to_string()).collect(),
            op: op.into(),
            function: "f".into(),
            kind,
            binding: None,
        }
    }

    #[test]
    fn each_form_is_code_of_the_users_own_operands() {
        let log = site("p.log()", "log", &["p"], OpKind::Log);
        let softmax = site(
            "candle_nn::ops::softmax(z, D::Minus1)",
            "softmax",
            &["z", "D::Minus1"],
            OpKind::Softmax,
        );
        let r = |site: &OpSite, form| Rewrite {
            site: site.clone(),
            form,
            from: Some(softmax.clone()),
            input: None,
            with: Vec::new(),
        };
        assert_eq!(
            r(&log, RewriteForm::LogSoftmax).code().unwrap(),
            "candle_nn::ops::log_softmax(z, D::Minus1)"
        );
        // A softmax by hand, exp(z) / Σ exp(z): the log_softmax of `z`.
        let exp = site("z.exp()", "exp", &["z"], OpKind::Exp);
        let by_hand = Rewrite {
            from: Some(exp),
            ..r(&log, RewriteForm::LogSoftmax)
        };
        assert_eq!(
            by_hand.code().unwrap(),
            "candle_nn::ops::log_softmax(&z, candle_core::D::Minus1)"
        );
        // log(1 − σ(z)): −softplus of the sigmoid's operand, or of the
        // name the log's function gave the logits.
        let sigmoid = site(
            "candle_nn::ops::sigmoid(&h)",
            "sigmoid",
            &["&h"],
            OpKind::Sigmoid,
        );
        let one_minus = site("(1.0 - p)?.log()", "log", &["(1.0 - p)?"], OpKind::Log);
        let neg_softplus = Rewrite {
            site: one_minus.clone(),
            form: RewriteForm::NegSoftplus,
            from: Some(sigmoid),
            input: None,
            with: Vec::new(),
        };
        assert_eq!(
            neg_softplus.code().unwrap(),
            "((h.abs()?.neg()?.exp()? + 1.0)?.log()? + h.relu()?)?.neg()"
        );
        let named = Rewrite {
            input: Some("logits".into()),
            ..neg_softplus
        };
        assert!(named.code().unwrap().starts_with("((logits.abs()?"));
        let gate = site("(1.0 - p)?.log()", "log", &["(1.0 - p)?"], OpKind::Log);
        assert_eq!(
            r(&gate, RewriteForm::OperandFloor { floor: 1e-8 })
                .code()
                .unwrap(),
            "(1.0 - p)?.maximum(1e-8)?.log()"
        );
        let pow = site(
            "h.relu()?.powf(0.5)",
            "powf",
            &["h.relu()?", "0.5"],
            OpKind::Pow,
        );
        assert_eq!(
            r(&pow, RewriteForm::OperandPlusEps { eps: 1e-5 })
                .code()
                .unwrap(),
            "(h.relu()? + 1e-5)?.powf(0.5)"
        );
        let div = site("a / (n + eps)?", "/", &["a", "(n + eps)?"], OpKind::Div);
        assert_eq!(
            r(&div, RewriteForm::DenominatorFloor { floor: 1e-8 })
                .code()
                .unwrap(),
            "a / (n + eps)?.maximum(1e-8)?"
        );
        let var = site(
            "h.var_keepdim(0)",
            "var_keepdim",
            &["h", "0"],
            OpKind::Variance,
        );
        assert_eq!(
            r(
                &var,
                RewriteForm::BiasedVariance {
                    dim: 0,
                    keepdim: true
                }
            )
            .code()
            .unwrap(),
            "h.broadcast_sub(&h.mean_keepdim(0)?)?.sqr()?.mean_keepdim(0)"
        );
        let cast = site(
            "m.to_dtype(s.dtype())",
            "to_dtype",
            &["m", "s.dtype()"],
            OpKind::Cast,
        );
        assert_eq!(
            r(&cast, RewriteForm::ClampBeforeCast { limit: 1e4 })
                .code()
                .unwrap(),
            "m.clamp(-1e4, 1e4)?.to_dtype(s.dtype())"
        );
    }

    #[test]
    fn a_region_in_f32_casts_its_half_operands_up_and_its_ends_back() {
        let w = |site: &OpSite, cast, back| Rewrite {
            site: site.clone(),
            form: RewriteForm::Widened {
                cast,
                back,
                entry: false,
            },
            from: None,
            input: None,
            with: Vec::new(),
        };
        let recv = "h.broadcast_sub(&h.mean_keepdim(0)?)?";
        let sqr = site(&format!("{recv}.sqr()"), "sqr", &[recv], OpKind::Mul);
        let up = format!("{recv}.to_dtype(candle_core::DType::F32)?.sqr()");
        assert_eq!(w(&sqr, 1, None).code().unwrap(), up);
        let div = site(
            "h.broadcast_div(&r)",
            "broadcast_div",
            &["h", "&r"],
            OpKind::Div,
        );
        assert_eq!(
            w(&div, 0b11, Some(HalfType::F16)).code().unwrap(),
            "h.to_dtype(candle_core::DType::F32)?.broadcast_div(&r.to_dtype(candle_core::DType::F32)?)?.to_dtype(candle_core::DType::F16)"
        );
        let add = site("d + 1.0", "+", &["d", "1.0"], OpKind::Add);
        assert_eq!(
            w(&add, 0, Some(HalfType::Bf16)).code().unwrap(),
            "(d + 1.0)?.to_dtype(candle_core::DType::BF16)"
        );
        // An op of the region whose operands are all the region's leaves
        // its line as it is.
        assert!(w(&add, 0, None).unchanged());
        // A chain over lines: its tail on the op's line is edited, where
        // the line holds that tail once.
        assert_eq!(
            edit("        .sqr()? // a comment", &sqr.text, &up).as_deref(),
            Some("        .to_dtype(candle_core::DType::F32)?.sqr()? // a comment")
        );
        assert_eq!(edit("        .sqr()?.sqr()?", &sqr.text, &up), None);
    }

    #[test]
    fn the_line_keeps_everything_but_the_expression() {
        assert_eq!(
            locate("    let y = (p . log()?)?;", "p.log()"),
            Some((13, 22))
        );
        assert_eq!(locate("let y = q.exp()?;", "p.log()"), None);
        assert_eq!(lit(1e-8), "1e-8");
        assert_eq!(lit(0.5), "0.5");
        assert_eq!(lit(1e4), "1e4");
        assert_eq!(lit(2.0), "2.0");
        let mut s = site("p.log()", "log", &["p"], OpKind::Log);
        s.file = file!().into();
        let d = Rewrite {
            site: s,
            form: RewriteForm::OperandPlusEps { eps: 1e-8 },
            from: None,
            input: None,
            with: Vec::new(),
        }
        .diff()
        .unwrap();
        // Not on that line of the file (nor readable from here): the expression.
        assert_eq!(
            (d.before.as_str(), d.after.as_str()),
            ("p.log()", "(p + 1e-8)?.log()")
        );
    }
}
