//! What a driver warns of while the loop goes on: the runner and the guard
//! give the same typed warnings (the rules are in [`crate::checks`]), kept
//! in the run's [`super::Trace`] and written into a scene as text.

use super::jump::Jump;
use serde::{Deserialize, Serialize};

/// One warning: the loop went on, but came this close to failing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Warning {
    /// A half-precision gradient came within `margin`× of its dtype's
    /// largest value: one more doubling of the loss or of the loss scale
    /// overflows it.
    HalfMargin {
        /// The step whose gradient it was.
        step: usize,
        /// The variable whose gradient it was.
        tensor: String,
        /// The gradient's dtype (`F16` or `BF16`).
        dtype: String,
        /// The gradient's largest magnitude.
        max_abs: f64,
        /// The dtype's largest finite value.
        limit: f64,
        /// The factor it came within.
        margin: f64,
    },
    /// A norm jumped: a finite explosion unless the loss recovers.
    Jump(Jump),
}

impl Warning {
    /// The step it was given at.
    pub fn step(&self) -> usize {
        match self {
            Warning::HalfMargin { step, .. } => *step,
            Warning::Jump(j) => j.step,
        }
    }

    /// The tensor it names (the variable, or the jump's leader).
    pub fn tensor(&self) -> &str {
        match self {
            Warning::HalfMargin { tensor, .. } => tensor,
            Warning::Jump(j) => &j.tensor,
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::HalfMargin {
                step,
                tensor,
                dtype,
                max_abs,
                limit,
                margin,
            } => write!(
                f,
                "step {step}: the gradient of `{tensor}` reached {max_abs:.4e}, within {margin}x of the largest {dtype} value {limit:.4e}"
            ),
            Warning::Jump(j) => write!(
                f,
                "step {}: {}: a finite explosion unless the loss recovers; clip the gradient norm or lower the learning rate",
                j.step,
                j.describe()
            ),
        }
    }
}
