//! A repair as the stable formulation a developer would write, as data:
//! what an explanation's pattern calls for at the stage, in a form the
//! tracer can substitute for a whole run ([`crate::intervention`]) and the
//! output can show as code to paste. The tensor arithmetic lives with the
//! intervention; this is what it computes.

use serde::{Deserialize, Serialize};

/// The axis a hand-written standardization reduces over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Axis {
    /// Across the batch (a batch norm: one statistic per column).
    Batch,
    /// Along each row's last dimension (a layer norm).
    Row,
}

/// The stable formulation substituted for a pattern. The first kinds move
/// what the stage reads (the record before it) into the op's domain, so
/// the stage's own code runs on it; the others recompute the stage from
/// what it read, with the repair in place.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Substitute {
    /// x + eps: a log or a root of exact zeros, 0·log(0).
    AddEps {
        /// Added.
        eps: f64,
    },
    /// max(x, min): a log or a root of negative values.
    ClampMin {
        /// The floor.
        min: f64,
    },
    /// x clamped into [min, max]: a gate saturated to exactly 1 or 0.
    ClampRange {
        /// The lower bound.
        min: f64,
        /// The upper bound.
        max: f64,
    },
    /// max(x, fill): a finite mask value where the mask is -inf.
    FiniteMask {
        /// The value in place of −inf.
        fill: f64,
    },
    /// log_softmax(x) over the last dimension for log(softmax(x)).
    LogSoftmax,
    /// x / sqrt(sum(x²) + eps) over the last dimension for x / ‖x‖.
    NormEps {
        /// Added under the root.
        eps: f64,
    },
    /// sqrt(x + eps) (of relu(x) when `rectified`) for sqrt(x): a root's
    /// slope at exactly 0.
    SqrtEps {
        /// Added under the root.
        eps: f64,
        /// Of relu(x).
        rectified: bool,
    },
    /// sqrt(sum(x²) + eps) over the last dimension for sqrt(sum(x²)).
    RootEps {
        /// Added under the root.
        eps: f64,
        /// Whether the sum keeps its dimension.
        keepdim: bool,
    },
    /// max + log(sum(exp(x − max))) over the last dimension for
    /// log(sum(exp(x))).
    LogSumExp {
        /// Whether the sum keeps its dimension.
        keepdim: bool,
    },
    /// exp(min(scale·x, cap)) for exp(scale·x).
    ClampedScaledExp {
        /// The exp's input scale.
        scale: f64,
        /// The cap.
        cap: f64,
    },
    /// (x − mean) / sqrt(var + eps) for (x − mean) / std.
    Standardize {
        /// The axis the statistics are over.
        axis: Axis,
        /// Bessel's correction.
        unbiased: bool,
        /// Added under the root.
        eps: f64,
    },
    /// The rows a mask added inside a softmax left entirely masked get the
    /// softmax of their scores (what a finite mask value gives them).
    SoftmaxOfMaskedRows,
    /// `x[i+1] / (x[i] + eps)` along `dim` for `x[i+1] / x[i]`.
    ShiftedRatioEps {
        /// The dimension.
        dim: usize,
        /// Added to the denominator.
        eps: f64,
    },
    /// The factors x[i+1] themselves for the ratio of a cumulative
    /// product of x to itself shifted by one (the product in log space).
    FactorOfCumprod {
        /// The dimension.
        dim: usize,
    },
    /// The probabilities a loss takes the log of, recomputed from the
    /// logits in log space: the value exp(log_softmax(x)) floored (at
    /// 2/sqrt of the dtype's largest value, where 1/p² stays finite), the
    /// gradient that of log_softmax (what a loss on the logits computes).
    LogSpaceSoftmax {
        /// The probabilities' floor.
        floor: f64,
    },
    /// A gate recomputed from its logits: sigmoid(x) clamped into
    /// [eps, 1 − eps] with the slope g·(1 − g) of the clamped value, so a
    /// log of it or of 1 − it downstream has the gradient of a binary
    /// cross-entropy on the logits (g − t), not the clamp's 0.
    LogSpaceSigmoid {
        /// The clamp's margin.
        eps: f64,
    },
}

/// A substitute and the record it reads: the record before the stage,
/// or one further back (the logits a softmax's log is recomputed from).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Formulation {
    /// The record it reads.
    pub reads: String,
    /// The record the substitute recomputes when it is not the stage (the
    /// probabilities a loss takes the log of); `None`: the stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
    /// The stable formulation.
    pub substitute: Substitute,
}

impl Formulation {
    /// The repair as candle code for `stage`.
    pub fn code(&self, stage: &str) -> String {
        match (&self.replaces, self.substitute) {
            (Some(probs), Substitute::LogSpaceSoftmax { .. }) => format!(
                "let log_{} = candle_nn::ops::log_softmax(&{}, D::Minus1)?; // in `{stage}`, use it for the log of `{probs}` (a cross-entropy or KL on the logits)",
                ident(probs),
                ident(&self.reads)
            ),
            (Some(gate), Substitute::LogSpaceSigmoid { .. }) => format!(
                "let log_{g} = candle_nn::ops::sigmoid(&{z})?.log()?; // in `{stage}`, compute log({g}) as -softplus(-{z}) and log(1 - {g}) as -softplus({z}): a binary cross-entropy on the logits `{}`",
                self.reads,
                g = ident(gate),
                z = ident(&self.reads),
            ),
            _ => self.substitute.code(&self.reads, stage),
        }
    }
}

impl Substitute {
    /// Whether it changes what the stage reads (the record before it)
    /// rather than the stage's own output.
    pub fn moves_input(self) -> bool {
        matches!(
            self,
            Substitute::AddEps { .. }
                | Substitute::ClampMin { .. }
                | Substitute::ClampRange { .. }
                | Substitute::FiniteMask { .. }
        )
    }

    /// The repair as candle code, `x` standing for the tensor the stage
    /// reads (`input`) and the result for the stage's output (`stage`).
    pub fn code(self, input: &str, stage: &str) -> String {
        let x = ident(input);
        let s = ident(stage);
        match self {
            Substitute::AddEps { eps } => {
                format!("let {x} = ({x} + {eps:e})?; // before `{stage}` reads it")
            }
            Substitute::ClampMin { min } => {
                format!("let {x} = {x}.maximum({min:e})?; // before `{stage}` reads it")
            }
            Substitute::ClampRange { min, max } => {
                format!("let {x} = {x}.clamp({min:e}, {max})?; // before `{stage}` reads it")
            }
            Substitute::FiniteMask { fill } => format!(
                "let {x} = {x}.maximum({fill:e})?; // a finite mask value, before `{stage}`"
            ),
            Substitute::LogSoftmax => {
                format!("let {s} = candle_nn::ops::log_softmax(&{x}, D::Minus1)?;")
            }
            Substitute::NormEps { eps } => format!(
                "let {s} = {x}.broadcast_div(&({x}.sqr()?.sum_keepdim(D::Minus1)? + {eps:e})?.sqrt()?)?;"
            ),
            Substitute::SqrtEps { eps, rectified } => {
                let r = if rectified { ".relu()?" } else { "" };
                format!("let {s} = ({x}{r} + {eps:e})?.sqrt()?;")
            }
            Substitute::RootEps { eps, keepdim } => {
                let sum = if keepdim { "sum_keepdim" } else { "sum" };
                format!("let {s} = ({x}.sqr()?.{sum}(D::Minus1)? + {eps:e})?.sqrt()?;")
            }
            Substitute::LogSumExp { keepdim } => {
                let (m, sum) = if keepdim {
                    ("m", "sum_keepdim")
                } else {
                    ("m.squeeze(D::Minus1)?", "sum")
                };
                format!(
                    "let m = {x}.max_keepdim(D::Minus1)?; let {s} = ({x}.broadcast_sub(&m)?.exp()?.{sum}(D::Minus1)?.log()? + {m})?;"
                )
            }
            Substitute::ClampedScaledExp { scale, cap } => {
                format!("let {s} = ({x} * {scale})?.minimum({cap})?.exp()?;")
            }
            Substitute::Standardize {
                axis,
                unbiased,
                eps,
            } => {
                let dim = match axis {
                    Axis::Batch => "0",
                    Axis::Row => "D::Minus1",
                };
                let var = if unbiased {
                    format!("(c.sqr()?.sum_keepdim({dim})? / (n - 1.0))?")
                } else {
                    format!("c.sqr()?.mean_keepdim({dim})?")
                };
                format!(
                    "let c = {x}.broadcast_sub(&{x}.mean_keepdim({dim})?)?; let {s} = c.broadcast_div(&({var} + {eps:e})?.sqrt()?)?;"
                )
            }
            Substitute::SoftmaxOfMaskedRows => format!(
                "// in `{stage}`: mask with a finite value (-1e9, or -1e4 in f16) instead of -inf, so a fully masked row of `{input}` stays a softmax of its scores"
            ),
            Substitute::FactorOfCumprod { dim } => format!(
                "let n = {x}.dim({dim})?; let {s} = {x}.narrow({dim}, 1, n - 1)?; // the ratio of consecutive cumulative products is the next factor"
            ),
            Substitute::LogSpaceSigmoid { .. } => format!(
                "// in `{stage}`: log(sigmoid({x})) = -softplus(-{x}), log(1 - sigmoid({x})) = -softplus({x})"
            ),
            Substitute::LogSpaceSoftmax { .. } => format!(
                "let log_p = candle_nn::ops::log_softmax(&{x}, D::Minus1)?; // in `{stage}`, instead of the log of a softmax"
            ),
            Substitute::ShiftedRatioEps { dim, eps } => format!(
                "let n = {x}.dim({dim})?; let {s} = {x}.narrow({dim}, 1, n - 1)?.broadcast_div(&({x}.narrow({dim}, 0, n - 1)? + {eps:e})?)?; // or compute the cumulative product in log space"
            ),
        }
    }
}

/// A record name as a Rust identifier: its last segment, other characters
/// as `_` (`blocks.0.probs` reads `probs`).
fn ident(name: &str) -> String {
    let last = name.rsplit('.').next().unwrap_or(name);
    let mut s: String = last
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'x');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_the_tensors_by_their_records() {
        assert_eq!(
            Substitute::AddEps { eps: 1e-8 }.code("blocks.0.probs", "log_probs"),
            "let probs = (probs + 1e-8)?; // before `log_probs` reads it"
        );
        assert_eq!(
            Substitute::LogSoftmax.code("logits", "h[0].nll"),
            "let nll = candle_nn::ops::log_softmax(&logits, D::Minus1)?;"
        );
        assert!(Substitute::AddEps { eps: 1e-8 }.moves_input());
        assert!(!Substitute::LogSoftmax.moves_input());
    }
}
