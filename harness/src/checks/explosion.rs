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
//!   losses after the jump comes back to the best loss seen up to it, or to
//!   the chance level when that is lower (a jump at step 0 follows a loss
//!   that may be far above chance: getting back under it is not learning).
//!
//! Only the first jump of a run is judged, and only when the run ends
//! without a harder failure (a NaN or a divergence after a jump is reported
//! as itself). `docs/NUMERICS.md` records what the rule was measured on.

use crate::error::Result;
use crate::finding::{Failure, FindingKind, Phase, Trace};
pub use crate::finding::{Grew, Jump};
use crate::probe::scan_all;
use candle_core::Tensor;

/// Three orders of magnitude in one step. Healthy runs of every built-in
/// example stay under 20× over 200 steps (measured: `explosion::tests` and
/// `tests/integration/explosion.rs`).
pub const JUMP: f64 = 1e3;

/// The least gradient norm, as a fraction of the parameters' norm, a jump
/// is measured from: a start whose gradient is nearly 0 (a saturated
/// softmax, 3.4e-7 against weights of norm 5) that turns typical (0.54)
/// grew a million-fold and is no explosion.
pub const GRADIENT_FLOOR: f64 = 1e-3;

/// Losses averaged to judge recovery; a run with fewer steps after its jump
/// is not judged (no finding).
pub const RECOVERY_WINDOW: usize = 5;

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
    /// The loss of a model that has learned nothing (the uniform
    /// prediction), when the loss has one ([`crate::spec::LossSpec::chance_loss`]).
    pub chance: Option<f64>,
    /// The lowest mean of `RECOVERY_WINDOW` consecutive losses after it.
    pub best_after: f64,
}

impl Recovery {
    /// The recovery after the jump at `step`, from the losses (`None` before any loss after it).
    pub fn of(losses: &[f64], step: usize, chance: Option<f64>) -> Option<Recovery> {
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
            chance: chance.filter(|c| c.is_finite()),
            best_after,
        })
    }

    /// What the loss must come back to: the best before the jump, or the
    /// chance level when that is lower.
    pub fn baseline(&self) -> f64 {
        self.chance
            .map_or(self.best_before, |c| c.min(self.best_before))
    }

    /// Whether the loss came back (to its best before the jump, or to chance).
    pub fn recovered(&self) -> bool {
        self.best_after <= self.baseline()
    }
}

/// The jump check as the steps go, the same in both drivers: the largest
/// gradient norm of the run so far, and the parameter norm before the
/// next update (the initialization's at step 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct JumpWatch {
    grad_norm_max: f64,
    param_norm: f64,
}

impl JumpWatch {
    /// The watch of a run whose parameters start at norm `init`.
    pub fn new(init: f64) -> Self {
        JumpWatch {
            grad_norm_max: 0.0,
            param_norm: init,
        }
    }

    /// The watch as it stands after the history `trace` (a restored
    /// state, a replayed scene).
    pub fn after(init: f64, trace: &Trace) -> Self {
        JumpWatch {
            grad_norm_max: trace.grad_norms.iter().copied().fold(0.0, f64::max),
            param_norm: trace.param_norms.last().copied().unwrap_or(init),
        }
    }

    /// A step's global gradient norm: the largest norm before it, when
    /// this one jumps over it. Against the run's largest so far: a
    /// gradient that was tiny one step (a fitted batch) and typical the
    /// next is no jump.
    pub fn gradient(&mut self, norm: f64) -> Option<f64> {
        let before = self.grad_norm_max;
        self.grad_norm_max = before.max(norm);
        // From a nearly-zero gradient, the floor is what it must jump over.
        let from = if before > 0.0 {
            before.max(GRADIENT_FLOOR * self.param_norm)
        } else {
            before
        };
        is_jump(from, norm).then_some(from)
    }

    /// The global parameter norm after an update: the norm before the
    /// update, when this one jumps over it.
    pub fn parameters(&mut self, norm: f64) -> Option<f64> {
        let before = self.param_norm;
        self.param_norm = norm;
        is_jump(before, norm).then_some(before)
    }
}

/// A jump's failure: `judged` says how its recovery was judged.
pub fn failure(jump: &Jump, judged: &str) -> Failure {
    let phase = match jump.grew {
        Grew::GradientNorm => Phase::Backward,
        Grew::ParameterNorm => Phase::Update,
    };
    Failure::new(
        FindingKind::Explosion,
        phase,
        jump.stage(),
        format!("{}{judged}", jump.describe()),
    )
}

/// Whether a run whose losses are `losses` never recovered from a jump at
/// `index` (its step's position in `losses`): the sentence that says so,
/// or `None` (recovered, or too few steps after it to judge).
/// `chance` is the loss's chance level, when it has one.
pub fn unrecovered(index: usize, losses: &[f64], chance: Option<f64>) -> Option<String> {
    let r = Recovery::of(losses, index, chance)?;
    (!r.recovered()).then(|| {
        let against = if r.baseline() < r.best_before {
            format!(
                "against the chance level {:.4e} (the best loss before it, {:.4e}, was above chance)",
                r.baseline(),
                r.best_before
            )
        } else {
            format!("against {:.4e} before", r.best_before)
        };
        format!(
            ", and the loss never recovered: its best mean over {RECOVERY_WINDOW} steps after it is {:.4e}, {against}",
            r.best_after
        )
    })
}

/// The tensor that leads a jump of the gradient norm: the one with the
/// largest Σg² (its index).
pub fn largest(sum_sq: &[f64]) -> usize {
    (0..sum_sq.len())
        .max_by(|&a, &b| sum_sq[a].total_cmp(&sum_sq[b]))
        .unwrap_or(0)
}

/// The tensor that leads a jump of the parameter norm: the one whose norm
/// grew the most from `then` to `now` in absolute terms (the one that
/// carries the explosion, not a bias that grew from nearly nothing).
pub fn fastest_growing(now: &[&Tensor], then: &[&Tensor]) -> Result<usize> {
    let (now, then) = (scan_all(now)?, scan_all(then)?);
    let growth = |i: usize| now[i].sum_sq.sqrt() - then[i].sum_sq.sqrt();
    Ok((0..now.len())
        .max_by(|&a, &b| growth(a).total_cmp(&growth(b)))
        .unwrap_or(0))
}

/// The judgement of a jump replayed alone, without the steps after it.
pub const UNJUDGED: &str = " (the jump alone: recovery is judged over a whole run)";

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
    fn a_gradient_from_nearly_zero_to_typical_is_no_jump() {
        // A saturated start: 3.4e-7 against weights of norm 5, then 0.54.
        let mut w = JumpWatch::new(5.0);
        assert_eq!(w.gradient(3.4e-7), None);
        assert_eq!(w.gradient(0.54), None);
        // From the floor (5e-3), a thousand-fold is still a jump.
        let mut w = JumpWatch::new(5.0);
        assert_eq!(w.gradient(3.4e-7), None);
        assert_eq!(w.gradient(6.0), Some(5e-3));
    }

    #[test]
    fn recovery_needs_a_window_of_losses_back_at_the_best_before() {
        let spike = [2.0, 1.5, 9.0, 8.0, 1.4, 1.4, 1.4, 1.4, 1.4];
        let r = Recovery::of(&spike, 1, None).unwrap();
        assert!(r.recovered(), "{r:?}");
        let stuck = [2.0, 1.5, 9.0, 8.0, 7.0, 6.0, 6.5, 6.2, 6.3];
        let r = Recovery::of(&stuck, 1, None).unwrap();
        assert!(!r.recovered());
        assert_eq!(r.best_before, 1.5);
        assert!(
            Recovery::of(&stuck, 6, None).is_none(),
            "too few steps after"
        );
    }

    #[test]
    fn below_a_bad_first_loss_but_above_chance_is_not_recovered() {
        // A jump at step 0 from a loss of 4.6 (chance: ln 4 = 1.39); the
        // losses after it come under 4.6 and stay above chance.
        let losses = [4.6, 14.0, 3.9, 2.2, 2.8, 2.1, 3.0, 2.5, 2.4];
        assert!(Recovery::of(&losses, 0, None).unwrap().recovered());
        let chance = Some(4f64.ln());
        let r = Recovery::of(&losses, 0, chance).unwrap();
        assert!(!r.recovered(), "{r:?}");
        let why = unrecovered(0, &losses, chance).unwrap();
        assert!(why.contains("chance level 1.3863e0"), "{why}");
        // Learning below chance after the jump is recovery.
        let learned = [4.6, 14.0, 1.2, 1.1, 1.0, 0.9, 0.9, 0.8, 0.8];
        assert!(Recovery::of(&learned, 0, chance).unwrap().recovered());
        // A chance level above the best before changes nothing.
        assert_eq!(
            Recovery::of(&learned, 0, Some(9.0)).unwrap().baseline(),
            4.6
        );
    }
}
