//! Loss functions, each with the eps/clamp knob that makes or breaks it.

use serde::{Deserialize, Serialize};

/// The loss a case trains with, with its eps and clamp knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LossSpec {
    /// Softmax cross-entropy via a stable log-sum-exp.
    CrossEntropy {
        /// Label smoothing, in [0, 1).
        #[serde(default)]
        label_smoothing: f64,
    },
    /// -log(softmax(z)_y + eps): the log of a softmax, as written naively.
    NaiveCrossEntropy {
        /// Added inside the log.
        #[serde(default)]
        eps: f64,
    },
    /// Negative log-likelihood of a log-softmax output (PyTorch's
    /// LogSoftmax + NLLLoss); the log-softmax is computed stably.
    Nll,
    /// Mean squared error; with `root`, sqrt(mse + eps) (RMSE), whose
    /// gradient at zero error is 0/0 when eps is 0.
    Mse {
        /// Take the square root (RMSE).
        #[serde(default)]
        root: bool,
        /// Added under the root.
        #[serde(default)]
        eps: f64,
    },
    /// Huber loss: quadratic within `delta` of the target, linear beyond.
    Huber {
        /// The error where quadratic turns linear.
        #[serde(default = "one")]
        delta: f64,
    },
    /// Binary cross-entropy on probabilities p = sigmoid(z), clamped to [eps, 1-eps].
    Bce {
        /// The clamp's margin.
        #[serde(default)]
        eps: f64,
    },
    /// Binary cross-entropy on logits: max(z,0) - z t + log(1 + exp(-|z|)).
    BceWithLogits,
    /// KL(t ‖ softmax(z)) with the prediction clamped to [eps, 1-eps].
    KlDiv {
        /// The clamp's margin.
        #[serde(default)]
        eps: f64,
    },
    /// Poisson NLL: exp(z) - t z when `log_input`, else z - t log(z + eps).
    PoissonNll {
        /// `z` is log λ (the rate is exp(z)).
        #[serde(default = "yes")]
        log_input: bool,
        /// Added inside the log when `log_input` is off.
        #[serde(default)]
        eps: f64,
    },
    /// The source article's custom loss, verbatim: mean(log(1 - p) * t) with
    /// p = sigmoid(z) clamped to [eps, 1-eps]; eps 0 leaves it unguarded.
    LogOneMinus {
        /// The clamp's margin (0: unguarded).
        #[serde(default)]
        eps: f64,
    },
    /// The caller's own loss (`RunOptions::loss`), on targets of this kind.
    Custom {
        /// What the user calls it (in stage names and reports).
        name: String,
        /// What the loss reads as targets.
        #[serde(default = "labels")]
        targets: TargetKind,
    },
}

fn labels() -> TargetKind {
    TargetKind::Labels
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}

/// What the targets of a loss look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// Class indices.
    Labels,
    /// Real vectors (regression).
    Values,
    /// Non-negative integer counts, as reals.
    Counts,
    /// Probability vectors (rows sum to 1, entries > 0).
    Distributions,
    /// Multi-label 0/1 vectors.
    Binary,
}

impl LossSpec {
    /// The loss of a model that has learned nothing — the uniform
    /// prediction over `classes` — where that does not depend on the
    /// targets: ln(classes) for the cross-entropies (with or without label
    /// smoothing), ln 2 for the binary ones. `None` for the rest
    /// (regression, KL, custom losses).
    pub fn chance_loss(&self, classes: usize) -> Option<f64> {
        match self {
            LossSpec::CrossEntropy { .. } | LossSpec::NaiveCrossEntropy { .. } | LossSpec::Nll
                if classes >= 2 =>
            {
                Some((classes as f64).ln())
            }
            LossSpec::Bce { .. } | LossSpec::BceWithLogits => Some(std::f64::consts::LN_2),
            _ => None,
        }
    }

    /// The loss's name as stages and reports give it.
    pub fn name(&self) -> &'static str {
        match self {
            LossSpec::CrossEntropy { .. } => "cross_entropy",
            LossSpec::NaiveCrossEntropy { .. } => "naive_cross_entropy",
            LossSpec::Nll => "nll",
            LossSpec::Mse { .. } => "mse",
            LossSpec::Huber { .. } => "huber",
            LossSpec::Bce { .. } => "bce",
            LossSpec::BceWithLogits => "bce_with_logits",
            LossSpec::KlDiv { .. } => "kl_div",
            LossSpec::PoissonNll { .. } => "poisson_nll",
            LossSpec::LogOneMinus { .. } => "log_one_minus",
            LossSpec::Custom { .. } => "custom",
        }
    }

    /// The loss's guard value (`eps`), where it has one.
    pub fn eps(&self) -> Option<f64> {
        match *self {
            LossSpec::NaiveCrossEntropy { eps }
            | LossSpec::Mse { eps, .. }
            | LossSpec::Bce { eps }
            | LossSpec::KlDiv { eps }
            | LossSpec::PoissonNll { eps, .. }
            | LossSpec::LogOneMinus { eps } => Some(eps),
            _ => None,
        }
    }

    /// The name with its eps (`kl_div (eps 0e0)`), so that a change of eps
    /// alone reads as one.
    pub fn describe(&self) -> String {
        match self.eps() {
            Some(eps) => format!("{} (eps {eps:e})", self.name()),
            None => self.name().to_string(),
        }
    }

    /// What the loss reads as targets.
    pub fn target_kind(&self) -> TargetKind {
        match self {
            LossSpec::CrossEntropy { .. } | LossSpec::NaiveCrossEntropy { .. } | LossSpec::Nll => {
                TargetKind::Labels
            }
            LossSpec::Mse { .. } | LossSpec::Huber { .. } => TargetKind::Values,
            LossSpec::PoissonNll { .. } => TargetKind::Counts,
            LossSpec::KlDiv { .. } => TargetKind::Distributions,
            LossSpec::Bce { .. } | LossSpec::BceWithLogits | LossSpec::LogOneMinus { .. } => {
                TargetKind::Binary
            }
            LossSpec::Custom { targets, .. } => *targets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_is_described_with_its_eps() {
        assert_eq!(LossSpec::KlDiv { eps: 0.0 }.describe(), "kl_div (eps 0e0)");
        assert_eq!(
            LossSpec::KlDiv { eps: 1e-8 }.describe(),
            "kl_div (eps 1e-8)"
        );
        assert_eq!(LossSpec::Nll.describe(), "nll");
    }
}
