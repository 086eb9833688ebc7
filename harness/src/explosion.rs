//! Finite explosions: training that blows up without a single NaN.
//!
//! A tanh RNN with large recurrent weights and no clipping can take a
//! gradient norm of 1e12 at its first step, move its weights to 1e11 and
//! then sit at a loss far above chance for the rest of the run — every
//! value finite, the smoothed loss never 4× its best. The rule here:
//!
//! - a **jump**: the global gradient norm is at least [`JUMP`] times the
//!   largest one of the run before it, or the global parameter norm after
//!   an update is at least `JUMP` times the one before the update (at step
//!   0: the initialization's);
//! - that **never recovered**: no mean of [`RECOVERY_WINDOW`] consecutive
//!   losses after the jump comes back to the best loss seen up to it.
//!
//! Only the first jump of a run is judged, and only when the run ends
//! without a harder failure (a NaN or a divergence after a jump is reported
//! as itself). `docs/NUMERICS.md` records what the rule was measured on.

use serde::Serialize;

/// Three orders of magnitude in one step. Healthy runs of every built-in
/// example stay under 20× over 200 steps (measured: `explosion::tests` and
/// `tests/integration/explosion.rs`).
pub const JUMP: f64 = 1e3;

/// Losses averaged to judge recovery; a run with fewer steps after its jump
/// is not judged (no finding).
pub const RECOVERY_WINDOW: usize = 5;

/// Which norm jumped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grew {
    /// The global gradient norm, against the run's largest before it.
    GradientNorm,
    /// The global parameter norm after the update, against the one before it.
    ParameterNorm,
}

/// A jump seen at a step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Jump {
    pub step: usize,
    pub grew: Grew,
    pub before: f64,
    pub after: f64,
    /// The tensor that leads it: the largest gradient, or the parameter
    /// that grew most.
    pub tensor: String,
}

impl Jump {
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

/// Whether `now` is a jump over `previous`.
pub fn is_jump(previous: f64, now: f64) -> bool {
    previous > 0.0 && previous.is_finite() && now.is_finite() && now >= JUMP * previous
}

/// How the loss went after a jump at `step`: `None` when fewer than
/// [`RECOVERY_WINDOW`] losses follow it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recovery {
    /// The best loss up to and including the jump's step.
    pub best_before: f64,
    /// The lowest mean of `RECOVERY_WINDOW` consecutive losses after it.
    pub best_after: f64,
}

impl Recovery {
    pub fn of(losses: &[f64], step: usize) -> Option<Recovery> {
        let (upto, after) = losses.split_at((step + 1).min(losses.len()));
        if after.len() < RECOVERY_WINDOW || upto.is_empty() {
            return None;
        }
        let best_before = upto.iter().copied().fold(f64::INFINITY, f64::min);
        let best_after = after
            .windows(RECOVERY_WINDOW)
            .map(|w| w.iter().sum::<f64>() / RECOVERY_WINDOW as f64)
            .fold(f64::INFINITY, f64::min);
        Some(Recovery {
            best_before,
            best_after,
        })
    }

    pub fn recovered(&self) -> bool {
        self.best_after <= self.best_before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_is_three_orders_of_magnitude_between_finite_values() {
        assert!(is_jump(1.0, 1e3));
        assert!(!is_jump(1.0, 999.0));
        assert!(!is_jump(0.0, 1.0), "no baseline");
        assert!(
            !is_jump(1.0, f64::INFINITY),
            "a non-finite value is another finding"
        );
    }

    #[test]
    fn recovery_needs_a_window_of_losses_back_at_the_best_before() {
        let spike = [2.0, 1.5, 9.0, 8.0, 1.4, 1.4, 1.4, 1.4, 1.4];
        let r = Recovery::of(&spike, 1).unwrap();
        assert!(r.recovered(), "{r:?}");
        let stuck = [2.0, 1.5, 9.0, 8.0, 7.0, 6.0, 6.5, 6.2, 6.3];
        let r = Recovery::of(&stuck, 1).unwrap();
        assert!(!r.recovered());
        assert_eq!(r.best_before, 1.5);
        assert!(Recovery::of(&stuck, 6).is_none(), "too few steps after");
    }
}
