//! What a run ends in, at the ground floor: every type a finding is made
//! of, below every procedure that fills one in. Instability is a result,
//! not an error: `Stable(trace) | Unstable(finding) | Rejected(reason)`.
//!
//! This module imports only the spec and the probe's result types, so the
//! runner, the guard, the checks, the explanation, the precision check and
//! the reports all read findings without importing each other.

mod coverage;
mod explanation;
mod failure;
mod framework;
mod history;
mod jump;
mod op;
mod precision;
mod replay;
mod rewrite;
mod signature;
mod site;
mod substitute;
mod warning;

pub use coverage::{Cut, CutKind, FlowStop, FrozenModule, GradientCoverage, NoBackwardOp};
pub use explanation::{Explanation, Pattern};
pub use failure::Failure;
pub use framework::{CandleRule, FrameworkMark, FrameworkVerdict};
pub use history::{Trace, TraceMark};
pub use jump::{Grew, Jump};
pub use op::{OpKind, OpSource, StageOp};
pub use precision::{PrecisionCheck, Rerun, Robustness, Zeros};
pub use replay::{ReplayReport, ReplayVerdict, SEED_THEM};
pub use rewrite::{is_place, line_diffs, lit, LineDiff, Rewrite, RewriteForm};
pub use signature::{replace_indices, stage_key, user_stage_key, Signature, StageKeys, Subject};
pub use site::{short_type_name, OpSite};
pub use substitute::{Axis, Formulation, Substitute};
pub use warning::Warning;

use crate::probe::TensorStats;
use serde::{Deserialize, Serialize};

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Outcome {
    /// It trained to its last step with no finding.
    Stable {
        /// Its history.
        trace: Trace,
    },
    /// It failed.
    Unstable {
        /// The first failure.
        finding: Box<Finding>,
    },
    /// The case cannot run as written (the reason names the field).
    Rejected {
        /// Why (it names the field).
        reason: String,
    },
}

/// How one run ended, as the journal, the report and `diff` record it: an
/// [`Outcome`]'s three, or one of the ways a campaign's run can end
/// without one. Serialized by name (`"stable"`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Verdict {
    /// It trained to its last step with no finding.
    Stable,
    /// It failed.
    Unstable,
    /// The case cannot run as written.
    Rejected,
    /// The run ended in an `Err` (a bug or an I/O failure).
    Error,
    /// The run panicked (caught).
    Panic,
    /// The worker process running it died.
    Crash,
    /// The run took longer than the campaign's `--case-timeout`.
    Timeout,
}

impl Verdict {
    /// The verdict's name (`stable`, `crash`, …).
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Stable => "stable",
            Verdict::Unstable => "unstable",
            Verdict::Rejected => "rejected",
            Verdict::Error => "error",
            Verdict::Panic => "panic",
            Verdict::Crash => "crash",
            Verdict::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A verdict equals its name (as in tests: `assert_eq!(v, "crash")`).
impl PartialEq<&str> for Verdict {
    fn eq(&self, name: &&str) -> bool {
        self.name() == *name
    }
}

impl Outcome {
    /// The verdict of this outcome.
    pub fn verdict(&self) -> Verdict {
        match self {
            Outcome::Stable { .. } => Verdict::Stable,
            Outcome::Unstable { .. } => Verdict::Unstable,
            Outcome::Rejected { .. } => Verdict::Rejected,
        }
    }

    /// The finding, when it failed.
    pub fn finding(&self) -> Option<&Finding> {
        match self {
            Outcome::Unstable { finding } => Some(finding),
            _ => None,
        }
    }

    /// The history, when it ran.
    pub fn trace(&self) -> Option<&Trace> {
        match self {
            Outcome::Stable { trace } => Some(trace),
            Outcome::Unstable { finding } => Some(&finding.trace),
            Outcome::Rejected { .. } => None,
        }
    }
}

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FindingKind {
    /// A NaN value.
    Nan,
    /// An infinite value.
    Inf,
    /// A value beyond the range of a half-precision dtype.
    Overflow,
    /// The smoothed loss rose above `divergence_factor` × its best value.
    Divergence,
    /// A class label outside [0, classes): silently wrong targets.
    InvalidLabel,
    /// Dynamic loss scaling halved the scale below its floor.
    ScaleCollapse,
    /// A trainable variable received no gradient: an op without a backward
    /// pass (candle's fused norms and softmax) or a detach cut it off.
    NoGradient,
    /// A finite explosion: the gradient or parameter norm jumped by orders
    /// of magnitude in one step and the loss never recovered
    /// (`crate::explosion`).
    Explosion,
    /// A gradient present but wrong: its derivative along a random
    /// direction disagrees with the loss's finite difference, steadily
    /// across two steps (the opt-in `RunOptions::check_gradients`).
    WrongGradient,
}

/// Where in the step a failure was produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The batch from the data source.
    Data,
    /// An augmentation.
    Augment,
    /// The forward pass.
    Forward,
    /// The loss.
    Loss,
    /// The backward pass.
    Backward,
    /// The optimizer's update.
    Update,
}

impl FindingKind {
    /// A NaN, an infinity or a value past a half-precision range.
    pub fn is_non_finite(self) -> bool {
        matches!(
            self,
            FindingKind::Nan | FindingKind::Inf | FindingKind::Overflow
        )
    }

    /// The kind's name (`nan`, `no_gradient`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Nan => "nan",
            FindingKind::Inf => "inf",
            FindingKind::Overflow => "overflow",
            FindingKind::Divergence => "divergence",
            FindingKind::InvalidLabel => "invalid_label",
            FindingKind::ScaleCollapse => "scale_collapse",
            FindingKind::NoGradient => "no_gradient",
            FindingKind::Explosion => "explosion",
            FindingKind::WrongGradient => "wrong_gradient",
        }
    }
}

impl Phase {
    /// The phase's name (`forward`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Augment => "augment",
            Phase::Forward => "forward",
            Phase::Loss => "loss",
            Phase::Backward => "backward",
            Phase::Update => "update",
        }
    }
}

/// A failure, where it was produced, and the evidence around it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// 0-based step at which the failure was first seen.
    pub step: usize,
    /// What went wrong.
    pub kind: FindingKind,
    /// Where in the step.
    pub phase: Phase,
    /// The producing stage, precisely (`data.pathologies[0].nan`, `augment[1].normalize`,
    /// `output`, `loss.naive_cross_entropy`, `grad.<param>`, `param.<param>`, ...).
    pub stage: String,
    /// What the producing stage computes, where known: declared by the
    /// model when it recorded the stage, or read from its name.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "op_or_name"
    )]
    pub op: Option<StageOp>,
    /// The op that produced it and its line, in a function instrumented
    /// with `#[nanhunt::instrument]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<OpSite>,
    /// One sentence on what was seen.
    pub detail: String,
    /// Statistics of the offending tensor, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<TensorStats>,
    /// A `no_gradient` finding's frozen tensors, by module, and where the
    /// gradient flow stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Box<GradientCoverage>>,
    /// Whether the failing step fails again in f32 / f64 (see [`crate::fidelity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Box<PrecisionCheck>>,
    /// What the producing stage did, read from its records ([`crate::explain`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Box<Explanation>>,
    /// The deduplication key.
    pub signature: Signature,
    /// The history up to the failing step.
    pub trace: Trace,
}

impl Finding {
    /// The one constructor of a finding: `failure` at `step` of the run
    /// `subject`, with the run's history up to it. The runner and the
    /// guard both build theirs here, so the same failure gets the same
    /// signature whoever drove the step.
    pub fn new(step: usize, failure: Failure, subject: &Subject, trace: Trace) -> Finding {
        let Failure {
            kind,
            phase,
            stage,
            op,
            site,
            detail,
            stats,
            coverage,
            explanation,
        } = failure;
        Finding {
            step,
            kind,
            phase,
            signature: subject.signature(kind, phase, &stage),
            stage,
            op,
            site,
            detail,
            stats,
            coverage,
            precision: None,
            explanation,
            trace,
        }
    }
}

impl Finding {
    /// For a NaN in the update: the parameter (an index into `names`)
    /// whose value or optimizer state it names (`param.<name>`,
    /// `optimizer.<kind>.<name>`), whose gradient the precision check
    /// reads for exact zeros.
    pub fn nan_update_param(&self, names: &[String]) -> Option<usize> {
        if self.phase != Phase::Update || self.kind != FindingKind::Nan {
            return None;
        }
        names.iter().position(|n| {
            self.stage.strip_prefix("param.") == Some(n.as_str())
                || self
                    .stage
                    .strip_prefix("optimizer.")
                    .and_then(|rest| rest.split_once('.'))
                    .is_some_and(|(_, name)| name == n)
        })
    }
}

/// A finding's `op`: as written now (`{"kind": "log", "source": "name"}`),
/// or as dumps from before typed ops wrote it (the op's name, read as a
/// name).
fn op_or_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StageOp>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Typed(StageOp),
        Name(String),
    }
    Ok(match Option::<Written>::deserialize(d)? {
        Some(Written::Typed(op)) => Some(op),
        Some(Written::Name(name)) => StageOp::of(&name, None),
        None => None,
    })
}
