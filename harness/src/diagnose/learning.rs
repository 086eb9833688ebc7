//! Verified means it trains: a fix whose run stayed stable is verified
//! only when it also learns, on its own numbers — at least [`MIN_STEPS`]
//! steps, its smoothed final loss below its first by [`FALL`] of it, and
//! its gradients not zero at the end — and when no fix from the same start
//! trained to a final loss more than a tolerance below it (the best fix
//! tried is the yardstick for the others, never the proof that one
//! learns). A flat or rising loss is "stable, not learning", whatever any
//! other run did. And a fix that only removes the trigger (a lower rate
//! for a NaN the code makes, a smaller init, cleaning data that had
//! nothing to clean, freezing the cut tensors) is a workaround: it ranks
//! below a verified repair.

use super::{Cause, CauseKind, Fix};
use crate::finding::{Finding, FindingKind, Outcome, Trace};
use serde::Serialize;

/// The fewest steps a run must train for its learning to be judged.
pub const MIN_STEPS: usize = 50;
/// How far the smoothed final loss must fall below the first, as a
/// fraction of the first's magnitude (final ≤ 0.9 × first for a positive
/// loss).
pub const FALL: f64 = 0.1;
/// The fraction of the best fix's drop (its first loss to its final one)
/// a fix's final loss may lie above the best's final loss.
pub const DROP_TOLERANCE: f64 = 0.2;
/// The tolerance's floor, as a fraction of the best fix's final loss.
pub const FLOOR_TOLERANCE: f64 = 0.05;

/// How a stable run of a fix trained.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Learning {
    /// The first step's loss.
    pub first_loss: f64,
    /// The mean of the last losses (a tenth of the run, 1 to 10 steps).
    pub final_loss: f64,
    /// The mean gradient norm over the same steps.
    pub final_grad_norm: f64,
    /// The steps it trained.
    pub steps: usize,
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
            steps: t.losses.len(),
        })
    }

    /// Whether this run's gradients reach the parameters at the end.
    fn moving(&self) -> bool {
        self.final_grad_norm > 0.0
    }

    /// How this run trained on its own numbers.
    fn trained(&self) -> Trained {
        if self.steps < MIN_STEPS {
            Trained::Short
        } else if !self.moving() {
            Trained::Frozen
        } else if self.final_loss > self.first_loss {
            Trained::Rose
        } else if self.final_loss > self.first_loss - FALL * self.first_loss.abs() {
            Trained::Flat
        } else {
            Trained::Learning
        }
    }

    /// Whether this run learns on its own numbers (whatever other runs did).
    pub fn learns_on_its_own(&self) -> bool {
        self.trained() == Trained::Learning
    }

    /// Whether this run trains as `before` did (the model as written, on
    /// data that never fires its bug): its gradients moving, its smoothed
    /// final loss within the tolerance of `before`'s either way.
    pub fn unchanged_from(&self, before: &Learning) -> bool {
        let drop = (before.first_loss - before.final_loss).abs();
        self.moving() && (self.final_loss - before.final_loss).abs() <= before.tolerance(drop)
    }

    /// How far another run's final loss may lie from this one's, for a
    /// drop of `drop` from its first loss.
    fn tolerance(&self, drop: f64) -> f64 {
        (DROP_TOLERANCE * drop).max(FLOOR_TOLERANCE * self.final_loss.abs())
    }

    /// How this run trained, and against `best` (the best fix from the
    /// same start): a run that learns but ends far above it is behind.
    fn against(&self, best: &Learning) -> Trained {
        let own = self.trained();
        let drop = (best.first_loss - best.final_loss).max(0.0);
        if own == Trained::Learning && self.final_loss > best.final_loss + best.tolerance(drop) {
            Trained::Behind
        } else {
            own
        }
    }

    /// Whether this run learns, on its own numbers, and as well as `best`.
    pub fn learns(&self, best: &Learning) -> bool {
        self.against(best) == Trained::Learning
    }

    /// "stable and learning over 60 steps: loss 2.3100 -> 0.4200 (the best
    /// fix from the same start: 0.4000)".
    pub fn describe(&self, best: &Learning) -> String {
        self.describe_against(best, "the best fix from the same start")
    }

    /// [`Learning::describe`] against `best`, named `what`.
    pub fn describe_against(&self, best: &Learning, what: &str) -> String {
        let losses = format!(
            "loss {:.4} -> {:.4}, smoothed over the last steps ({what}: {:.4})",
            self.first_loss, self.final_loss, best.final_loss
        );
        let over = format!("over {} steps", self.steps);
        match self.against(best) {
            Trained::Learning => format!("stable and learning {over}: {losses}"),
            Trained::Short => format!(
                "stable {over}, learning not judged: fewer than {MIN_STEPS} steps; {losses}"
            ),
            Trained::Frozen => {
                format!("stable {over}, not learning: the gradient is 0 at the end; {losses}")
            }
            Trained::Rose => format!("stable {over}, not learning: the loss rose; {losses}"),
            Trained::Flat => format!(
                "stable {over}, not learning: the loss fell by less than {:.0}% of its first value; {losses}",
                FALL * 100.0
            ),
            Trained::Behind => format!(
                "stable {over}, but trains to a loss more than the tolerance above {what}: {losses}"
            ),
        }
    }
}

/// How a stable run trained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trained {
    /// Its smoothed final loss fell by the margin, its gradient moving,
    /// and it is within the tolerance of the best fix's.
    Learning,
    /// Too few steps to judge.
    Short,
    /// Its gradient is 0 at the end: nothing trains.
    Frozen,
    /// Its final loss is above its first.
    Rose,
    /// Its final loss fell by less than the margin.
    Flat,
    /// It learns, to a final loss more than the tolerance above the best's.
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
            steps: 60,
        }
    }

    #[test]
    fn a_fix_learns_on_its_own_numbers_and_near_the_best() {
        let best = learning(1.39, 0.779, 0.5);
        assert!(learning(1.39, 0.80, 0.5).learns(&best));
        // Trained far worse than the best fix: 1.135 vs 0.779.
        assert!(!learning(1.39, 1.135, 0.5).learns(&best));
        // Loss 0 and gradient 0 at every step: nothing trained.
        assert!(!learning(0.0, 0.0, 0.0).learns(&best));
        assert!(learning(1.39, 0.80, 0.5)
            .describe(&best)
            .starts_with("stable and learning over 60 steps: loss 1.3900 -> 0.8000"));
    }

    #[test]
    fn no_run_whose_smoothed_loss_did_not_fall_is_called_learning() {
        let flat = learning(0.9852, 0.9852, 0.3);
        let one_step = Learning { steps: 1, ..flat };
        let rising = learning(1404.9, 2095.6, 10.0);
        let barely = learning(1.0, 0.95, 0.3);
        let short_but_falling = Learning {
            steps: 20,
            ..learning(1.0, 0.1, 0.3)
        };
        for run in [flat, one_step, rising, barely, short_but_falling] {
            // Against itself, and against a worse run: never learning.
            for best in [run, learning(run.first_loss, run.final_loss + 1.0, 0.1)] {
                let said = run.describe(&best);
                assert!(!run.learns(&best), "{said}");
                assert!(!said.contains("and learning"), "{said}");
                assert!(
                    said.contains(&format!("over {} steps", run.steps)),
                    "{said}"
                );
            }
        }
        assert!(rising.describe(&rising).contains("the loss rose"));
        assert!(one_step.describe(&one_step).contains("not judged"));
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
