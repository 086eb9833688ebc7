//! A finding's precision check as the finding carries it: does the
//! failing step fail again at higher precision ([`crate::fidelity`] runs
//! the re-runs)?

use serde::{Deserialize, Serialize};

/// What the re-runs say about a finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Robustness {
    /// Gone in f32 and in f64: it hinges on the lower precision's range or
    /// rounding (and on how candle computes there).
    PrecisionDependent,
    /// Back in f32, gone in f64.
    ReproducesInF32,
    /// Back in f64 (or the case runs in f64).
    ReproducesInF64,
    /// Back in f64, but it is 0/0 on gradient elements that are exactly
    /// 0.0: zero in exact arithmetic, they can come out as tiny noise
    /// under another library's summation order, and the finding with them.
    HangsOnExactZeros,
    /// The re-runs could not run (the model does not run in f64, say).
    NotChecked,
    /// A re-run failed, but not as the finding did (another kind, phase or
    /// stage): no evidence either way, and never "reproduced".
    FailsDifferently,
}

impl Robustness {
    /// The verdict as reports give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Robustness::PrecisionDependent => "precision-dependent",
            Robustness::ReproducesInF32 => "reproduces in f32",
            Robustness::ReproducesInF64 => "reproduces in f64",
            Robustness::HangsOnExactZeros => "hinges on exact zeros",
            Robustness::NotChecked => "not checked at higher precision",
            Robustness::FailsDifferently => "fails differently at higher precision",
        }
    }
}

/// One re-run of the failing step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rerun {
    /// The precision it ran at (`f32`, `f64`, `pytorch_f16`, …).
    pub precision: String,
    /// The step could be run at this precision.
    pub ran: bool,
    /// The step failed again, as the finding did (the same kind, phase and
    /// stage; an overflow and an infinity count as one).
    pub reproduced: bool,
    /// The step failed, but otherwise than the finding did.
    #[serde(default)]
    pub differs: bool,
    /// What it showed: the failure seen, or why it could not run.
    pub note: String,
}

/// The exactly-zero elements of a gradient, and how many of them are
/// structural (they stay 0.0 when the parameters move by 1e-6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zeros {
    /// Exactly-zero elements.
    pub exact: usize,
    /// Those that stay zero when the parameters move.
    pub structural: usize,
}

/// A finding's precision check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrecisionCheck {
    /// What the re-runs say.
    pub verdict: Robustness,
    /// Each re-run.
    pub reruns: Vec<Rerun>,
    /// For a NaN in the update: the elements of the failing parameter's
    /// gradient that are exactly 0.0 in the f64 re-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_zero_gradients: Option<usize>,
    /// How many of those stay exactly 0.0 when every parameter moves by a
    /// relative 1e-6: structural zeros (a weight behind a dead unit, an
    /// embedding row never indexed), which any framework's gradient has;
    /// the others are rounding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structural_zero_gradients: Option<usize>,
    /// Would PyTorch fail too, or is it one of candle's rules?
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<super::FrameworkMark>,
}

impl PrecisionCheck {
    /// One line for reports: the verdict and the re-runs.
    pub fn summary(&self) -> String {
        let runs: Vec<String> = self
            .reruns
            .iter()
            .map(|r| format!("{}: {}", r.precision, r.note))
            .collect();
        let zeros = match self.exact_zero_gradients {
            Some(n) if self.verdict == Robustness::HangsOnExactZeros => {
                format!("; 0/0 on {n} gradient elements that are exactly 0.0")
            }
            _ => String::new(),
        };
        format!("{} ({}{zeros})", self.verdict.as_str(), runs.join("; "))
    }
}

impl Robustness {
    /// The verdict of the re-runs: the f32 one (half-precision cases only)
    /// and the f64 one, each `None` or not `ran` when it could not run, and
    /// the exact-zero gradient elements of the f64 re-run.
    pub fn of(
        f32_run: Option<&Rerun>,
        f64_run: Option<&Rerun>,
        zeros: Option<usize>,
    ) -> Robustness {
        let (f32_run, f64_run) = (f32_run.filter(|r| r.ran), f64_run.filter(|r| r.ran));
        let reproduced = |r: Option<&Rerun>| r.is_some_and(|r| r.reproduced);
        let differs = |r: Option<&Rerun>| r.is_some_and(|r| r.differs);
        if reproduced(f64_run) {
            return match zeros {
                Some(n) if n > 0 => Robustness::HangsOnExactZeros,
                _ => Robustness::ReproducesInF64,
            };
        }
        if reproduced(f32_run) {
            return Robustness::ReproducesInF32;
        }
        match (f32_run, f64_run) {
            (None, None) => Robustness::NotChecked,
            _ if differs(f32_run) || differs(f64_run) => Robustness::FailsDifferently,
            _ => Robustness::PrecisionDependent,
        }
    }
}

impl Rerun {
    /// A re-run that could not run at `precision`, and why.
    pub fn not_run(precision: &str, why: impl std::fmt::Display) -> Rerun {
        Rerun {
            precision: precision.to_string(),
            ran: false,
            reproduced: false,
            differs: false,
            note: format!("could not run: {why}"),
        }
    }

    /// A re-run of `finding`'s step that ran at `precision` and saw `seen`
    /// (a failure of the step) or `jump` (an explosion's jump at the step),
    /// or neither. A failure reproduces the finding only when it is the same
    /// failure: another kind, phase or stage "fails differently".
    pub fn ran(
        precision: &str,
        finding: &super::Finding,
        seen: Option<&super::Finding>,
        jump: Option<&super::Jump>,
    ) -> Rerun {
        let same = seen.is_some_and(|f| same_failure(finding, f));
        let note = match (seen, jump) {
            (Some(f), _) => {
                let what = format!(
                    "{} in {} at `{}`",
                    f.kind.as_str(),
                    f.phase.as_str(),
                    f.stage
                );
                if same {
                    what
                } else {
                    format!("fails differently: {what}")
                }
            }
            (None, Some(j)) => j.describe(),
            (None, None) => "the step is healthy".into(),
        };
        Rerun {
            precision: precision.to_string(),
            ran: true,
            reproduced: same || (seen.is_none() && jump.is_some()),
            differs: seen.is_some() && !same,
            note,
        }
    }
}

/// Whether `seen` is `finding` again: the same phase and stage, and the
/// same kind (an overflow past a half precision's range and an infinity at
/// a higher one are one failure).
fn same_failure(finding: &super::Finding, seen: &super::Finding) -> bool {
    use super::FindingKind::{Inf, Overflow};
    let kind = finding.kind == seen.kind
        || matches!((finding.kind, seen.kind), (Overflow, Inf) | (Inf, Overflow));
    kind && finding.phase == seen.phase && finding.stage == seen.stage
}

impl PrecisionCheck {
    /// The check of a run that computes in f64: nothing higher to re-run in.
    pub fn in_f64() -> PrecisionCheck {
        PrecisionCheck {
            verdict: Robustness::ReproducesInF64,
            reruns: Vec::new(),
            exact_zero_gradients: None,
            structural_zero_gradients: None,
            framework: None,
        }
    }

    /// The check from its re-runs: in f32 (half-precision runs only) and
    /// in f64, with the exact-zero gradient elements of the f64 one.
    pub fn of(f32_run: Option<Rerun>, f64_run: Rerun, zeros: Option<Zeros>) -> PrecisionCheck {
        let exact = zeros.map(|z| z.exact);
        let verdict = Robustness::of(f32_run.as_ref(), Some(&f64_run), exact);
        PrecisionCheck {
            verdict,
            reruns: f32_run.into_iter().chain([f64_run]).collect(),
            exact_zero_gradients: exact,
            structural_zero_gradients: zeros.map(|z| z.structural),
            framework: None,
        }
    }
}
