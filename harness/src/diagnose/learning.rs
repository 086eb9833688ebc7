//! Verified means it trains: a fix whose run stayed stable is verified
//! only when it also learns — its gradients are not zero at the end and
//! its smoothed final loss comes within a tolerance of a reference, the
//! best final loss any tried fix reached (a stable run that zeroes a stage
//! trains nothing: loss and gradient norm 0.0 at every step). And a fix
//! that only removes the trigger (a lower rate for a NaN the code makes,
//! a smaller init, cleaning data that had nothing to clean, freezing the
//! cut tensors) is a workaround: it ranks below a verified repair.

use super::{Cause, CauseKind, Fix};
use crate::finding::{Finding, FindingKind, Outcome, Trace};
use serde::Serialize;

/// The fraction of the reference's drop (its first loss to its final one)
/// a fix's final loss may lie above the reference's final loss.
pub const DROP_TOLERANCE: f64 = 0.2;
/// The tolerance's floor, as a fraction of the reference's final loss
/// (runs too short, or at too low a rate, to drop).
pub const FLOOR_TOLERANCE: f64 = 0.05;

/// How a stable run of a fix trained.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Learning {
    pub first_loss: f64,
    /// The mean of the last losses (a tenth of the run, 1 to 10 steps).
    pub final_loss: f64,
    /// The mean gradient norm over the same steps.
    pub final_grad_norm: f64,
}

impl Learning {
    /// The learning of a stable run; `None` for any other outcome.
    pub fn of(outcome: &Outcome) -> Option<Learning> {
        match outcome {
            Outcome::Stable { trace } => Learning::of_trace(trace),
            _ => None,
        }
    }

    fn of_trace(t: &Trace) -> Option<Learning> {
        let first_loss = *t.losses.first()?;
        let window = (t.losses.len() / 10).clamp(1, 10);
        let mean = |v: &[f64]| {
            let tail = &v[v.len().saturating_sub(window)..];
            tail.iter().sum::<f64>() / tail.len().max(1) as f64
        };
        Some(Learning {
            first_loss,
            final_loss: mean(&t.losses),
            final_grad_norm: mean(&t.grad_norms),
        })
    }

    /// Whether this run's gradients reach the parameters at the end.
    fn moving(&self) -> bool {
        self.final_grad_norm > 0.0
    }

    /// Whether its final loss is above its first (by more than the floor).
    fn rose(&self) -> bool {
        self.final_loss > self.first_loss + FLOOR_TOLERANCE * self.first_loss.abs()
    }

    /// How this run trained against `reference`.
    fn against(&self, reference: &Learning) -> Trained {
        let drop = (reference.first_loss - reference.final_loss).max(0.0);
        let tolerance = (DROP_TOLERANCE * drop).max(FLOOR_TOLERANCE * reference.final_loss.abs());
        if !self.moving() {
            Trained::Frozen
        } else if self.final_loss > reference.final_loss + tolerance {
            Trained::Behind
        } else if self.rose() && !reference.rose() {
            // A reference that rose too says the case does not train
            // within its steps, fixed or not; this one is as good.
            Trained::Rose
        } else {
            Trained::Learning
        }
    }

    /// Whether this run learns as well as `reference` (a fixed model's
    /// run, the best fix): moving, within the tolerance of its final loss,
    /// and not risen where it did not.
    pub fn learns(&self, reference: &Learning) -> bool {
        self.against(reference) == Trained::Learning
    }

    /// "stable and learning: loss 2.31 -> 0.42 (reference 0.40)".
    fn describe(&self, reference: &Learning) -> String {
        let losses = format!(
            "loss {:.4} -> {:.4} (reference {:.4})",
            self.first_loss, self.final_loss, reference.final_loss
        );
        match self.against(reference) {
            Trained::Learning => format!("stable and learning: {losses}"),
            Trained::Frozen => {
                format!("stable, not learning: the gradient is 0 at the end; {losses}")
            }
            Trained::Rose => format!("stable, not learning: the loss rose; {losses}"),
            Trained::Behind => format!(
                "stable, not learning as well as the best fix: {losses}, more than the tolerance above it"
            ),
        }
    }
}

/// How a stable run trained against its reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trained {
    /// Its final loss is within the tolerance of the reference's.
    Learning,
    /// Its gradient is 0 at the end: nothing trains.
    Frozen,
    /// Its final loss is above its first, where the reference's is not.
    Rose,
    /// It trains, to a final loss more than the tolerance above the reference's.
    Behind,
}

/// Judges every stable fix of `causes` against the best of the fixes
/// that train the same problem, and labels the workarounds; scores follow
/// the verdicts.
pub(super) fn judge(causes: &mut [Cause], finding: &Finding, data_clean: bool) {
    let trained: Vec<Learning> = causes
        .iter()
        .flat_map(|c| &c.fixes)
        .filter_map(|f| f.learning.filter(Learning::moving))
        .collect();
    for cause in causes.iter_mut() {
        let workaround = workaround(cause.kind, finding.kind, data_clean);
        for fix in &mut cause.fixes {
            fix.workaround = workaround;
            judge_fix(fix, &trained);
        }
        // Verified first, each group in the order the cause tried them.
        cause.fixes.sort_by_key(|f| !f.verified);
        cause.rescore();
    }
}

/// The fraction of a first loss within which two runs start from the same
/// problem: the same data and initialization give the same first loss
/// whatever the rate, the clipping or the eps; a fix that changes the data
/// (no padding-only samples, cleaned inputs) starts elsewhere and is no
/// yardstick for the others.
const SAME_START: f64 = 0.02;

fn judge_fix(fix: &mut Fix, trained: &[Learning]) {
    let Some(l) = fix.learning else {
        return;
    };
    let same_start = |r: &&Learning| {
        (r.first_loss - l.first_loss).abs()
            <= SAME_START * l.first_loss.abs().max(f64::MIN_POSITIVE)
    };
    // No comparable fix moved its gradients: this one is its own reference.
    let reference = trained
        .iter()
        .filter(same_start)
        .min_by(|a, b| a.final_loss.total_cmp(&b.final_loss))
        .unwrap_or(&l);
    fix.verified = l.learns(reference);
    fix.result = l.describe(reference);
}

/// Whether a fix of `kind` only removes the trigger of `finding`.
fn workaround(kind: CauseKind, finding: FindingKind, data_clean: bool) -> bool {
    let trend = matches!(finding, FindingKind::Divergence | FindingKind::Explosion);
    match kind {
        // For a trend the rate is the repair; for a NaN the code makes it
        // only postpones it.
        CauseKind::LearningRate | CauseKind::InitScale => !trend,
        CauseKind::Data | CauseKind::Augmentation => data_clean,
        CauseKind::NoBackward => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learning(first: f64, last: f64, grad: f64) -> Learning {
        Learning {
            first_loss: first,
            final_loss: last,
            final_grad_norm: grad,
        }
    }

    #[test]
    fn a_fix_learns_within_a_fifth_of_the_reference_drop() {
        let reference = learning(1.39, 0.779, 0.5);
        assert!(learning(1.39, 0.80, 0.5).learns(&reference));
        // Trained far worse than the real fix: 1.135 vs 0.779.
        assert!(!learning(1.39, 1.135, 0.5).learns(&reference));
        // Loss 0 and gradient 0 at every step: nothing trained.
        assert!(!learning(0.0, 0.0, 0.0).learns(&reference));
        assert!(learning(1.39, 0.80, 0.5)
            .describe(&reference)
            .starts_with("stable and learning: loss 1.3900 -> 0.8000 (reference 0.7790)"));
        // A run whose loss rose is not learning where the reference's fell.
        assert!(!learning(1.39, 1.6, 0.5).learns(&reference));
    }

    #[test]
    fn a_lower_rate_is_a_workaround_for_a_nan_and_the_repair_of_a_trend() {
        let nan = FindingKind::Nan;
        assert!(workaround(CauseKind::LearningRate, nan, false));
        assert!(!workaround(CauseKind::Data, nan, false));
        assert!(workaround(CauseKind::Data, nan, true));
        assert!(!workaround(CauseKind::UnsafeLoss, nan, true));
        assert!(!workaround(
            CauseKind::LearningRate,
            FindingKind::Divergence,
            false
        ));
    }
}
