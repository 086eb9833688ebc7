//! What an op or a recorded stage computes, as a type: explanations,
//! localization, the hunt and diagnose branch on it, never on a name. On
//! the ground floor, so that the ops of instrumented code anywhere (the
//! optimizers' op chain included) carry it; [`crate::finding`] re-exports it.

use serde::{Deserialize, Serialize};

/// The kind of computation a recorded stage (or an instrumented op) performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OpKind {
    /// log(x): -inf at 0, NaN below it.
    Log,
    /// sqrt(x): NaN below 0, an infinite slope at 0.
    Sqrt,
    /// x^p: for p < 1 an infinite slope at 0, NaN below it for non-integer p.
    Pow,
    /// exp(x): past the dtype's range above ln(max).
    Exp,
    /// a / b: 0/0 and x/0.
    Div,
    /// A softmax: NaN over a row that is entirely -inf.
    Softmax,
    /// A log-softmax (log of a softmax computed in log space).
    LogSoftmax,
    /// A sigmoid, 1 / (1 + exp(-x)).
    Sigmoid,
    /// A normalization (layer, RMS, batch, group norm; x / ‖x‖): a division
    /// by a norm or a standard deviation.
    Norm,
    /// A mask added to or filled into scores.
    Mask,
    /// Attention scores, q·kᵀ (an accumulation).
    Scores,
    /// A matrix product (an accumulation).
    Matmul,
    /// A linear layer (an accumulation).
    Linear,
    /// A convolution (an accumulation).
    Conv,
    /// An element-wise activation (relu, gelu, tanh, silu, swiglu).
    Activation,
    /// Pooling (max, average, global average).
    Pool,
    /// A residual sum.
    Residual,
    /// An embedding lookup.
    Embedding,
    /// A recurrent cell's gates or state.
    Recurrent,
    /// A sum or a mean over an axis (an accumulation).
    Reduce,
    /// The loss.
    Loss,
    /// Gradient clipping.
    Clip,
    /// a + b (element-wise or broadcast).
    Add,
    /// a − b.
    Sub,
    /// a · b, x², an affine map: 0·∞ is NaN, a product can overflow.
    Mul,
    /// −x.
    Neg,
    /// |x|.
    Abs,
    /// max(x, a), min(x, b), a clamp into [a, b].
    Clamp,
    /// where(mask, a, b): a value picked per position.
    Select,
    /// A cast to another dtype: a value past the target's range overflows.
    Cast,
    /// A comparison (a mask of 0s and 1s).
    Compare,
    /// A reshape, slice, transpose, broadcast, concatenation or gather:
    /// values moved, none computed.
    View,
    /// A variance over an axis: of one value, (n − 1) = 0 divides 0 by 0.
    Variance,
    /// A max or a min over an axis.
    Extremum,
    /// A module's `forward` (a linear layer, an embedding, a user's block).
    Layer,
    /// None of the kinds above.
    Other,
}

impl OpKind {
    /// The kind's name (`log`, `div`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Log => "log",
            OpKind::Sqrt => "sqrt",
            OpKind::Pow => "pow",
            OpKind::Exp => "exp",
            OpKind::Div => "div",
            OpKind::Softmax => "softmax",
            OpKind::LogSoftmax => "log_softmax",
            OpKind::Sigmoid => "sigmoid",
            OpKind::Norm => "norm",
            OpKind::Mask => "mask",
            OpKind::Scores => "scores",
            OpKind::Matmul => "matmul",
            OpKind::Linear => "linear",
            OpKind::Conv => "conv",
            OpKind::Activation => "activation",
            OpKind::Pool => "pool",
            OpKind::Residual => "residual",
            OpKind::Embedding => "embedding",
            OpKind::Recurrent => "recurrent",
            OpKind::Reduce => "reduce",
            OpKind::Loss => "loss",
            OpKind::Clip => "clip",
            OpKind::Add => "add",
            OpKind::Sub => "sub",
            OpKind::Mul => "mul",
            OpKind::Neg => "neg",
            OpKind::Abs => "abs",
            OpKind::Clamp => "clamp",
            OpKind::Select => "select",
            OpKind::Cast => "cast",
            OpKind::Compare => "compare",
            OpKind::View => "view",
            OpKind::Variance => "variance",
            OpKind::Extremum => "extremum",
            OpKind::Layer => "layer",
            OpKind::Other => "other",
        }
    }

    /// A sum of products whose result can leave the dtype's range although
    /// its inputs are inside it.
    pub fn accumulates(self) -> bool {
        matches!(
            self,
            OpKind::Matmul
                | OpKind::Linear
                | OpKind::Conv
                | OpKind::Scores
                | OpKind::Reduce
                | OpKind::Layer
        )
    }

    /// The kind a stage's name reads as, by whole words of its last
    /// segment (`encoder.log_probs` → log, `rms_norm` → norm, `ln1` →
    /// norm), or `None`. Whole words only: `logits` is no log and
    /// `expert` no exp.
    pub fn from_name(stage: &str) -> Option<OpKind> {
        let last = stage.rsplit('.').next()?;
        let last = last
            .trim_end_matches(|c: char| c.is_ascii_digit() || c == ']' || c == '[')
            .to_ascii_lowercase();
        let words: Vec<&str> = last
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        let has = |w: &str| words.contains(&w);
        let kind = if (has("log") && has("softmax")) || has("logsoftmax") {
            OpKind::LogSoftmax
        } else if has("log") || has("logsumexp") {
            OpKind::Log
        } else if has("exp") {
            OpKind::Exp
        } else if has("sqrt") || has("rsqrt") {
            OpKind::Sqrt
        } else if has("pow") {
            OpKind::Pow
        } else if has("div") || has("ratio") {
            OpKind::Div
        } else if has("softmax") {
            OpKind::Softmax
        } else if has("sigmoid") {
            OpKind::Sigmoid
        } else if last == "bn"
            || last == "ln"
            || words.last().is_some_and(|w| *w == "ln")
            || words.iter().any(|w| w.ends_with("norm"))
        {
            OpKind::Norm
        } else if has("mask") || has("masked") {
            OpKind::Mask
        } else if has("scores") {
            OpKind::Scores
        } else if has("matmul") {
            OpKind::Matmul
        } else if has("conv") {
            OpKind::Conv
        } else if has("linear") {
            OpKind::Linear
        } else if ["relu", "gelu", "tanh", "silu", "swiglu"]
            .iter()
            .any(|w| has(w))
        {
            OpKind::Activation
        } else if has("pool") {
            OpKind::Pool
        } else if has("residual") {
            OpKind::Residual
        } else if has("embed") || has("embedding") {
            OpKind::Embedding
        } else if ["loss", "nll", "xent", "entropy", "kl"]
            .iter()
            .any(|w| has(w))
        {
            OpKind::Loss
        } else {
            return None;
        };
        Some(kind)
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn names_read_by_whole_words() {
        assert_eq!(OpKind::from_name("middle.log"), Some(OpKind::Log));
        assert_eq!(OpKind::from_name("log_probs"), Some(OpKind::Log));
        assert_eq!(OpKind::from_name("logits"), None, "logits is no log");
        assert_eq!(OpKind::from_name("expert"), None, "expert is no exp");
        assert_eq!(
            OpKind::from_name("head.log_softmax"),
            Some(OpKind::LogSoftmax)
        );
        assert_eq!(OpKind::from_name("sqrt"), Some(OpKind::Sqrt));
        for norm in [
            "block0.bn",
            "layer1.ln1",
            "final_ln",
            "encoder.layer_norm",
            "blocks[3].norm2",
            "model.RMSNorm",
            "rownorm",
        ] {
            assert_eq!(OpKind::from_name(norm), Some(OpKind::Norm), "{norm}");
        }
        assert_eq!(OpKind::from_name("block0.conv"), Some(OpKind::Conv));
        assert_eq!(
            OpKind::from_name("layer0.attn.softmax"),
            Some(OpKind::Softmax)
        );
        assert_eq!(OpKind::from_name("head.linear"), Some(OpKind::Linear));
        assert_eq!(OpKind::from_name("embed"), Some(OpKind::Embedding));
        assert_eq!(OpKind::from_name("gate"), None);
    }
}
