//! A run's per-step history: losses, gradient and parameter norms, learning
//! rates. A trace only grows within a step, so a [`TraceMark`] (its
//! lengths) undoes a step.

use serde::{Deserialize, Serialize};

/// Per-step history of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Loss of each executed step (the failing step's value included).
    #[serde(with = "crate::floats::vec")]
    pub losses: Vec<f64>,
    /// Global gradient norm (unscaled, before clipping) of each step where
    /// it was computed.
    #[serde(with = "crate::floats::vec")]
    pub grad_norms: Vec<f64>,
    /// Global parameter norm after each update where the probe read it
    /// (the finite-explosion rule compares consecutive ones).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::floats::vec"
    )]
    pub param_norms: Vec<f64>,
    /// Learning rate of each executed step.
    pub lrs: Vec<f64>,
    /// Steps skipped by dynamic loss scaling.
    pub skipped_steps: usize,
    /// The loss scale at the end (mixed precision only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// What the run warned of and went on (half-precision margins, jumps).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<super::Warning>,
}

/// The length of a trace's histories at some moment (a trace only grows
/// within a step, so truncating to a mark undoes the step).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceMark {
    losses: usize,
    grad_norms: usize,
    param_norms: usize,
    lrs: usize,
    skipped_steps: usize,
    warnings: usize,
}

impl Trace {
    /// The histories' lengths now (to undo a step with [`Trace::truncate`]).
    pub fn mark(&self) -> TraceMark {
        TraceMark {
            losses: self.losses.len(),
            grad_norms: self.grad_norms.len(),
            param_norms: self.param_norms.len(),
            lrs: self.lrs.len(),
            skipped_steps: self.skipped_steps,
            warnings: self.warnings.len(),
        }
    }

    /// Back to the state at `mark`.
    pub fn truncate(&mut self, mark: TraceMark) {
        self.losses.truncate(mark.losses);
        self.grad_norms.truncate(mark.grad_norms);
        self.param_norms.truncate(mark.param_norms);
        self.lrs.truncate(mark.lrs);
        self.skipped_steps = mark.skipped_steps;
        self.warnings.truncate(mark.warnings);
    }

    /// A copy as it was at `mark`.
    pub fn upto(&self, mark: TraceMark) -> Trace {
        let mut t = self.clone();
        t.truncate(mark);
        t.loss_scale = None;
        t
    }

    /// The histories added after `mark` (the steps since it).
    pub fn since(&self, mark: TraceMark) -> Trace {
        Trace {
            losses: self.losses[mark.losses.min(self.losses.len())..].to_vec(),
            grad_norms: self.grad_norms[mark.grad_norms.min(self.grad_norms.len())..].to_vec(),
            param_norms: self.param_norms[mark.param_norms.min(self.param_norms.len())..].to_vec(),
            lrs: self.lrs[mark.lrs.min(self.lrs.len())..].to_vec(),
            skipped_steps: self.skipped_steps.saturating_sub(mark.skipped_steps),
            loss_scale: self.loss_scale,
            warnings: self.warnings[mark.warnings.min(self.warnings.len())..].to_vec(),
        }
    }

    /// The first step's loss.
    pub fn first_loss(&self) -> Option<f64> {
        self.losses.first().copied()
    }

    /// The last step's loss.
    pub fn last_loss(&self) -> Option<f64> {
        self.losses.last().copied()
    }
}
