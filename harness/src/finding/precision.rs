//! A finding's precision check as the finding carries it: does the
//! failing step fail again at higher precision ([`crate::fidelity`] runs
//! the re-runs)?

use serde::{Deserialize, Serialize};

/// What the re-runs say about a finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Robustness {
    /// Gone in f32 and in f64: it hangs on the lower precision's range or
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
}

impl Robustness {
    pub fn as_str(self) -> &'static str {
        match self {
            Robustness::PrecisionDependent => "precision-dependent",
            Robustness::ReproducesInF32 => "reproduces in f32",
            Robustness::ReproducesInF64 => "reproduces in f64",
            Robustness::HangsOnExactZeros => "hangs on exact zeros",
            Robustness::NotChecked => "not checked at higher precision",
        }
    }
}

/// One re-run of the failing step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rerun {
    pub precision: String,
    /// The step could be run at this precision.
    pub ran: bool,
    /// The step failed again.
    pub reproduced: bool,
    /// What it showed: the failure seen, or why it could not run.
    pub note: String,
}

/// A finding's precision check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrecisionCheck {
    pub verdict: Robustness,
    pub reruns: Vec<Rerun>,
    /// For a NaN in the update: the elements of the failing parameter's
    /// gradient that are exactly 0.0 in the f64 re-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_zero_gradients: Option<usize>,
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
    /// The verdict of the re-runs: whether the f32 re-run (half-precision
    /// cases only) and the f64 re-run ran and failed again (`None`: could
    /// not run), and the exact-zero gradient elements of the f64 re-run.
    pub fn of(f32_run: Option<bool>, f64_run: Option<bool>, zeros: Option<usize>) -> Robustness {
        match (f32_run, f64_run) {
            (_, Some(true)) => match zeros {
                Some(n) if n > 0 => Robustness::HangsOnExactZeros,
                _ => Robustness::ReproducesInF64,
            },
            (Some(true), _) => Robustness::ReproducesInF32,
            (None, None) => Robustness::NotChecked,
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
            note: format!("could not run: {why}"),
        }
    }

    /// A re-run that ran at `precision` and saw `seen` (a failure of the
    /// step) or `jump` (an explosion's jump at the step), or neither.
    pub fn ran(
        precision: &str,
        seen: Option<&super::Finding>,
        jump: Option<&super::Jump>,
    ) -> Rerun {
        let note = match (seen, jump) {
            (Some(f), _) => format!(
                "{} in {} at `{}`",
                f.kind.as_str(),
                f.phase.as_str(),
                f.stage
            ),
            (None, Some(j)) => j.describe(),
            (None, None) => "the step is healthy".into(),
        };
        Rerun {
            precision: precision.to_string(),
            ran: true,
            reproduced: seen.is_some() || jump.is_some(),
            note,
        }
    }
}

impl PrecisionCheck {
    /// The check of a run that computes in f64: nothing higher to re-run in.
    pub fn in_f64() -> PrecisionCheck {
        PrecisionCheck {
            verdict: Robustness::ReproducesInF64,
            reruns: Vec::new(),
            exact_zero_gradients: None,
        }
    }

    /// The check from its re-runs: in f32 (half-precision runs only) and
    /// in f64, with the exact-zero gradient elements of the f64 one.
    pub fn of(f32_run: Option<Rerun>, f64_run: Rerun, zeros: Option<usize>) -> PrecisionCheck {
        let ran = |r: Option<&Rerun>| r.filter(|r| r.ran).map(|r| r.reproduced);
        let verdict = Robustness::of(ran(f32_run.as_ref()), ran(Some(&f64_run)), zeros);
        PrecisionCheck {
            verdict,
            reruns: f32_run.into_iter().chain([f64_run]).collect(),
            exact_zero_gradients: zeros,
        }
    }
}
