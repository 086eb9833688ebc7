//! A failure seen at a stage of a step, before it becomes a [`Finding`]
//! (the step's number, the run's signature and its history are the
//! driver's to add: [`Finding::new`]).

use super::{Explanation, FindingKind, GradientCoverage, OpSite, Phase, StageOp};
use crate::probe::{TensorScan, TensorStats};

#[cfg(doc)]
use super::Finding;

/// What a check or the localization saw go wrong.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// What went wrong.
    pub kind: FindingKind,
    /// Where in the step.
    pub phase: Phase,
    /// The producing stage, precisely.
    pub stage: String,
    /// What the stage computes, where known.
    pub op: Option<StageOp>,
    /// The op and its line, for an op of an instrumented function.
    pub site: Option<OpSite>,
    /// One sentence on what was seen.
    pub detail: String,
    /// Statistics of the offending tensor, where there is one.
    pub stats: Option<TensorStats>,
    /// A `no_gradient` failure's tensors and where the flow stopped.
    pub coverage: Option<Box<GradientCoverage>>,
    /// What the producing stage did (a traced re-run's records).
    pub explanation: Option<Box<Explanation>>,
}

impl Failure {
    /// A failure of `kind` in `phase` at `stage`, described by `detail`.
    pub fn new(
        kind: FindingKind,
        phase: Phase,
        stage: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Failure {
            kind,
            phase,
            stage: stage.into(),
            op: None,
            site: None,
            detail: detail.into(),
            stats: None,
            coverage: None,
            explanation: None,
        }
    }

    /// With the offending tensor's statistics.
    pub fn with_stats(mut self, stats: TensorStats) -> Self {
        self.stats = Some(stats);
        self
    }

    /// With what the stage computes.
    pub fn with_op(mut self, op: Option<StageOp>) -> Self {
        self.op = op;
        self
    }

    /// With the op's site.
    pub fn with_site(mut self, site: Option<OpSite>) -> Self {
        self.site = site;
        self
    }

    /// With a `no_gradient` failure's coverage.
    pub fn with_coverage(mut self, coverage: GradientCoverage) -> Self {
        self.coverage = Some(Box::new(coverage));
        self
    }

    /// With what the producing stage did.
    pub fn with_explanation(mut self, explanation: Explanation) -> Self {
        self.explanation = Some(Box::new(explanation));
        self
    }
}

impl FindingKind {
    /// The kind of a non-finite value: NaN, else (an infinity) an overflow
    /// of the format in half precision and an `inf` otherwise.
    pub fn of_non_finite(nan: bool, half: bool) -> FindingKind {
        if nan {
            FindingKind::Nan
        } else if half {
            FindingKind::Overflow
        } else {
            FindingKind::Inf
        }
    }

    /// The kind of a scanned tensor that failed a check.
    pub fn of_scan(scan: &TensorScan, half: bool) -> FindingKind {
        if scan.nan == 0 && scan.inf == 0 {
            // Finite but past the dtype's range.
            FindingKind::Overflow
        } else {
            FindingKind::of_non_finite(scan.nan > 0, half)
        }
    }
}
