//! A finite explosion's jump as a finding carries it (the rule that sees
//! it is [`crate::checks::explosion`]).

use serde::{Deserialize, Serialize};

/// Which norm jumped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grew {
    /// The global gradient norm, against the run's largest before it.
    GradientNorm,
    /// The global parameter norm after the update, against the one before it.
    ParameterNorm,
}

/// A jump seen at a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Jump {
    /// The step whose norm jumped.
    pub step: usize,
    /// Which norm.
    pub grew: Grew,
    /// The norm before.
    pub before: f64,
    /// The norm after.
    pub after: f64,
    /// The tensor that leads it: the largest gradient, or the parameter
    /// that grew most.
    pub tensor: String,
}

impl Jump {
    /// How many times the norm grew.
    pub fn factor(&self) -> f64 {
        self.after / self.before
    }

    /// The finding's stage: `grad.<tensor>` or `param.<tensor>`.
    pub fn stage(&self) -> String {
        match self.grew {
            Grew::GradientNorm => format!("grad.{}", self.tensor),
            Grew::ParameterNorm => format!("param.{}", self.tensor),
        }
    }

    /// The jump in words.
    pub fn describe(&self) -> String {
        let what = match self.grew {
            Grew::GradientNorm => "the gradient norm",
            Grew::ParameterNorm => "the parameter norm",
        };
        format!(
            "{what} grew {:.2e}x in one step (from {:.3e} to {:.3e}), led by `{}`",
            self.factor(),
            self.before,
            self.after,
            self.tensor
        )
    }
}
