//! Is a gradient present but wrong? The finite-difference tolerance that
//! follows from a computation's precision (shared with `gradcheck`), and
//! the judgement of one directional derivative: the runner's opt-in check
//! at the first step (`RunOptions::check_gradients`) compares each
//! tensor's gradient along a seeded random direction with the loss's
//! central difference along it, at two steps.

use crate::finding::{Failure, FindingKind, Phase};
use serde::Serialize;

/// Central-difference step.
pub const STEP: f64 = 1e-6;
/// A coordinate passes when |analytic - numeric| <= ATOL + RTOL * max(|a|, |n|).
/// In f64 the central difference has truncation error O(h^2 f''') ~ 1e-12 and
/// rounding error ~ e_f / h, where e_f (the error of evaluating the loss, a
/// few thousand f64 ops) is about 1e-14, i.e. ~ 1e-8: ATOL is ten times that.
/// The small step keeps ReLU and max-pool kinks from being crossed. A wrong
/// backward formula is off by O(|gradient|), far above RTOL.
pub const RTOL: f64 = 1e-5;
/// The absolute tolerance of an f64 check.
pub const ATOL: f64 = 1e-7;
/// The step and tolerance of a check, which follow from its precision.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    /// Central-difference step.
    pub step: f64,
    /// A coordinate agrees when
    /// |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|).
    pub atol: f64,
    /// The relative tolerance.
    pub rtol: f64,
}

impl Tolerance {
    /// The f64 check: see [`STEP`], [`ATOL`], [`RTOL`].
    pub const F64: Tolerance = Tolerance {
        step: STEP,
        atol: ATOL,
        rtol: RTOL,
    };

    /// The check of a computation in f32, for a loss of magnitude `loss`.
    /// Evaluating the loss costs about [`ROUNDING_BUDGET`] units of f32
    /// rounding (2^-23 of the loss each); the central difference divides
    /// that error by its step. A step of 1e-3 keeps truncation (h² f'''/6,
    /// about 1e-7 f''') below it. A wrong backward formula is off by
    /// O(|gradient|), far above an rtol of 1e-2.
    pub fn f32(loss: f64) -> Tolerance {
        let step = 1e-3;
        Tolerance {
            step,
            atol: ROUNDING_BUDGET * f64::from(f32::EPSILON) * loss.abs().max(1.0) / step,
            rtol: 1e-2,
        }
    }

    /// The tolerance at another step: rounding error grows as the step shrinks.
    pub fn at(self, step: f64) -> Tolerance {
        Tolerance {
            step,
            atol: self.atol * (self.step / step).max(1.0),
            rtol: self.rtol,
        }
    }

    /// Whether an analytic and a numeric derivative agree within it.
    pub fn holds(self, analytic: f64, numeric: f64) -> bool {
        (analytic - numeric).abs() <= self.atol + self.rtol * analytic.abs().max(numeric.abs())
    }
}

/// Units of rounding error one evaluation of a loss accumulates (an
/// estimate for models of up to a few thousand ops per output).
pub const ROUNDING_BUDGET: f64 = 64.0;

/// The step ten times the check's, where rounding matters less: a numeric
/// derivative that agrees there with the check's step is steady.
pub const LARGER_STEP: f64 = 10.0;

/// Whether a gradient is wrong as far as finite differences can tell: the
/// central differences at the tolerance's step (`numeric`) and at
/// [`LARGER_STEP`] times it (`larger`) agree with each other and not with
/// `analytic`. A difference that moves with the step cannot judge it.
pub fn steadily_off(analytic: f64, numeric: f64, larger: f64, tol: Tolerance) -> bool {
    let finite = analytic.is_finite() && numeric.is_finite() && larger.is_finite();
    finite && !tol.holds(analytic, numeric) && tol.holds(numeric, larger)
}

/// A tensor's directional derivative: `analytic` (the gradient's dot
/// product with a unit direction) against the central differences at the
/// tolerance's step and [`LARGER_STEP`] times it: a failure when
/// [`steadily_off`].
pub fn directional(
    name: &str,
    analytic: f64,
    numeric: f64,
    larger: f64,
    tol: Tolerance,
) -> Option<Failure> {
    if !steadily_off(analytic, numeric, larger, tol) {
        return None;
    }
    let error = (analytic - numeric).abs() / numeric.abs().max(f64::MIN_POSITIVE);
    let module = name.rsplit_once('.').map_or(name, |(m, _)| m);
    Some(Failure::new(
        FindingKind::WrongGradient,
        Phase::Backward,
        format!("grad.{name}"),
        format!(
            "the gradient of `{name}` (module `{module}`) is wrong along a random direction: analytic {analytic:.6e}, numeric {numeric:.6e} at step {:.0e} and {larger:.6e} at {:.0e}, off by {:.1}% of the numeric value",
            tol.step,
            LARGER_STEP * tol.step,
            100.0 * error
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_steady_difference_off_the_gradient_is_wrong() {
        let tol = Tolerance::F64;
        // Off by a factor of two, the same at both steps.
        let f = directional("a.weight", 2.0, 1.0, 1.0, tol).unwrap();
        assert_eq!(
            (f.kind, f.stage.as_str()),
            (FindingKind::WrongGradient, "grad.a.weight")
        );
        assert!(
            f.detail.contains("module `a`") && f.detail.contains("100.0%"),
            "{}",
            f.detail
        );
        // Agreement, a difference that moves with the step, a NaN: no finding.
        assert!(directional("a", 1.0, 1.0, 1.0, tol).is_none());
        assert!(directional("a", 2.0, 1.0, 1.5, tol).is_none());
        assert!(directional("a", f64::NAN, 1.0, 1.0, tol).is_none());
    }
}
