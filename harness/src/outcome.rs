//! What a run ends in. Instability is a result, not an error:
//! `Stable(trace) | Unstable(finding) | Rejected(reason)`.

use crate::probe::TensorStats;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Outcome {
    Stable {
        trace: Trace,
    },
    Unstable {
        finding: Box<Finding>,
    },
    /// The case cannot run as written (the reason names the field).
    Rejected {
        reason: String,
    },
}

/// How one run ended, as the journal, the report and `diff` record it: an
/// [`Outcome`]'s three, or one of the ways a campaign's run can end
/// without one. Serialized by name (`"stable"`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Stable,
    Unstable,
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
    pub fn verdict(&self) -> Verdict {
        match self {
            Outcome::Stable { .. } => Verdict::Stable,
            Outcome::Unstable { .. } => Verdict::Unstable,
            Outcome::Rejected { .. } => Verdict::Rejected,
        }
    }

    pub fn finding(&self) -> Option<&Finding> {
        match self {
            Outcome::Unstable { finding } => Some(finding),
            _ => None,
        }
    }

    pub fn trace(&self) -> Option<&Trace> {
        match self {
            Outcome::Stable { trace } => Some(trace),
            Outcome::Unstable { finding } => Some(&finding.trace),
            Outcome::Rejected { .. } => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    Nan,
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
    /// ([`crate::explosion`]).
    Explosion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Data,
    Augment,
    Forward,
    Loss,
    Backward,
    Update,
}

impl FindingKind {
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
        }
    }
}

impl Phase {
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

/// The stage as a dedup key: indices dropped, so that the same fault in
/// `layer0.t3.gates` and `layer1.t7.gates`, or in `data.pathologies[1].nan`
/// and `data.pathologies[0].nan`, is one signature (`layer.t.gates`,
/// `data.pathologies.nan`). The finding keeps the precise stage.
pub fn stage_key(stage: &str) -> String {
    let stripped: String = stage
        .chars()
        .filter(|c| !c.is_ascii_digit() && *c != '[' && *c != ']')
        .collect();
    let mut out = String::with_capacity(stripped.len());
    for part in stripped.split('.').filter(|p| !p.is_empty()) {
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(part);
    }
    out
}

/// The stage as a dedup key in a user's model: only the harness's own
/// indices are dropped (`data.pathologies[1].nan` → `data.pathologies.nan`),
/// the digits of the user's names are kept: `fc1` and `fc2` are different
/// layers, not two copies of one block as `layer0`/`layer1` of a built-in
/// family are.
pub fn user_stage_key(stage: &str) -> String {
    replace_indices(stage, "")
}

/// `name` with every numeric index (`[3]`) replaced by `with`; other
/// brackets (`[x]`) are kept.
pub fn replace_indices(name: &str, with: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close)
                if rest[open + 1..open + close]
                    .chars()
                    .all(|c| c.is_ascii_digit()) =>
            {
                out.push_str(&rest[..open]);
                out.push_str(with);
                rest = &rest[open + close + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The dedup key of a finding: what failed, where (the stage without its
/// indices, see [`stage_key`]), under which configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Signature {
    pub kind: FindingKind,
    pub phase: Phase,
    pub stage: String,
    pub family: String,
    pub optimizer: String,
    pub precision: String,
    pub device: String,
}

impl Signature {
    /// A file-system-safe name: lowercase ASCII letters, digits, '-', '_'
    /// and '.'; anything else becomes '_'.
    pub fn slug(&self) -> String {
        let raw = format!(
            "{}-{}-{}-{}-{}-{}-{}",
            self.kind.as_str(),
            self.phase.as_str(),
            self.stage,
            self.family,
            self.optimizer,
            self.precision,
            self.device
        );
        let mut out = String::with_capacity(raw.len());
        for ch in raw.chars() {
            let c = ch.to_ascii_lowercase();
            match c {
                ']' => {}
                c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => out.push(c),
                _ => out.push('_'),
            }
        }
        out.truncate(120);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_stage_keys_keep_the_users_digits() {
        assert_eq!(user_stage_key("grad.fc1.weight"), "grad.fc1.weight");
        assert_ne!(
            user_stage_key("grad.fc1.weight"),
            user_stage_key("grad.fc2.weight")
        );
        assert_eq!(
            user_stage_key("data.pathologies[1].nan"),
            "data.pathologies.nan"
        );
        assert_eq!(user_stage_key("augment[2].normalize"), "augment.normalize");
        assert_eq!(user_stage_key("blocks[x].norm2"), "blocks[x].norm2");
    }

    #[test]
    fn stage_keys_drop_indices() {
        assert_eq!(stage_key("layer0.t3.gates"), "layer.t.gates");
        assert_eq!(stage_key("data.pathologies[1].nan"), "data.pathologies.nan");
        assert_eq!(stage_key("augment[2].normalize"), "augment.normalize");
        assert_eq!(stage_key("param.block2.conv.bias"), "param.block.conv.bias");
        assert_eq!(stage_key("loss.cross_entropy"), "loss.cross_entropy");
    }
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} in {} at `{}` ({} / {} / {} / {})",
            self.kind.as_str(),
            self.phase.as_str(),
            self.stage,
            self.family,
            self.optimizer,
            self.precision,
            self.device
        )
    }
}

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
}

impl Trace {
    pub fn mark(&self) -> TraceMark {
        TraceMark {
            losses: self.losses.len(),
            grad_norms: self.grad_norms.len(),
            param_norms: self.param_norms.len(),
            lrs: self.lrs.len(),
            skipped_steps: self.skipped_steps,
        }
    }

    /// Back to the state at `mark`.
    pub fn truncate(&mut self, mark: TraceMark) {
        self.losses.truncate(mark.losses);
        self.grad_norms.truncate(mark.grad_norms);
        self.param_norms.truncate(mark.param_norms);
        self.lrs.truncate(mark.lrs);
        self.skipped_steps = mark.skipped_steps;
    }

    /// A copy as it was at `mark`.
    pub fn upto(&self, mark: TraceMark) -> Trace {
        let mut t = self.clone();
        t.truncate(mark);
        t.loss_scale = None;
        t
    }

    pub fn first_loss(&self) -> Option<f64> {
        self.losses.first().copied()
    }

    pub fn last_loss(&self) -> Option<f64> {
        self.losses.last().copied()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// 0-based step at which the failure was first seen.
    pub step: usize,
    pub kind: FindingKind,
    pub phase: Phase,
    /// The producing stage, precisely (`data.pathologies[0].nan`, `augment[1].normalize`,
    /// `output`, `loss.naive_cross_entropy`, `grad.<param>`, `param.<param>`, ...).
    pub stage: String,
    /// The op kind of the producing stage, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// One sentence on what was seen.
    pub detail: String,
    /// Statistics of the offending tensor, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<TensorStats>,
    /// A `no_gradient` finding's frozen tensors, by module, and where the
    /// gradient flow stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Box<crate::coverage::GradientCoverage>>,
    /// Whether the failing step fails again in f32 / f64 (see [`crate::fidelity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Box<crate::fidelity::PrecisionCheck>>,
    /// What the producing stage did, read from its records ([`crate::explain`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Box<crate::explain::Explanation>>,
    pub signature: Signature,
    pub trace: Trace,
}
