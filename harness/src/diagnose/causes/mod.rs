//! The causes diagnose puts forward, one file each: what the cause is, the
//! changed cases (or runs) that would fix it, the evidence that points at
//! it, and how well it fits the failure ([`Relevance`]), in one place.
//!
//! Each is a [`Rule`]; [`RULES`] lists them in the order their causes are
//! put forward (ties in the ranking keep it).

mod attention;
mod augmentation;
mod clipping;
pub(super) mod code;
pub(super) mod data;
mod hardware;
mod init;
mod knob;
pub(super) mod learning_rate;
mod loss;
pub(super) mod no_backward;
mod norm_eps;
pub(super) mod optimizer_eps;
pub(super) mod precision;

pub use data::INPUT_SCALE;
pub use knob::KNOB_CANDIDATES;
pub use learning_rate::LR_SEARCH_DECADES;
pub use loss::stable_loss;

use super::context::{Context, Runs, Variant};
use super::rank::Relevance;
use super::{Cause, Fix};
use crate::error::Result;
use crate::finding::{Finding, Phase};
use crate::spec::KnobSpec;
use serde::Serialize;

/// What a candidate root cause is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CauseKind {
    /// The data (the article's step 2).
    Data,
    /// An augmentation.
    Augmentation,
    /// The learning rate.
    LearningRate,
    /// No gradient clipping.
    NoClipping,
    /// An unsafe loss formulation.
    UnsafeLoss,
    /// The optimizer's eps.
    OptimizerEps,
    /// A normalization's eps.
    NormEps,
    /// The initialization's scale.
    InitScale,
    /// The precision.
    Precision,
    /// The device (step 5).
    Device,
    /// The thread count (step 5).
    Threads,
    /// A trainable tensor gets no gradient (an op without a backward pass).
    NoBackward,
    /// A knob the model declares (`model.knobs`).
    ModelKnob,
    /// Unscaled attention logits (q·k without 1/sqrt(d)).
    AttentionScale,
    /// An attention mask that makes non-finite logits (-inf rows, 0·-inf).
    AttentionMask,
    /// A numerical bug in a user's own model code, at the stage the finding
    /// names (see [`crate::explain`]), tested by an intervention.
    CodeBug,
}

impl CauseKind {
    /// The article's step this cause belongs to.
    pub fn article_step(self) -> u8 {
        match self {
            CauseKind::Data | CauseKind::Augmentation => 2,
            CauseKind::LearningRate
            | CauseKind::NoClipping
            | CauseKind::OptimizerEps
            | CauseKind::InitScale
            | CauseKind::NoBackward => 3,
            CauseKind::UnsafeLoss
            | CauseKind::NormEps
            | CauseKind::ModelKnob
            | CauseKind::AttentionScale
            | CauseKind::AttentionMask
            | CauseKind::CodeBug => 4,
            CauseKind::Precision | CauseKind::Device | CauseKind::Threads => 5,
        }
    }

    /// The cause's title in reports.
    pub fn title(self) -> &'static str {
        match self {
            CauseKind::Data => "bad values in the data",
            CauseKind::Augmentation => "an augmentation produces bad values",
            CauseKind::LearningRate => "learning rate too high",
            CauseKind::NoClipping => "exploding gradients without clipping",
            CauseKind::UnsafeLoss => "numerically unsafe loss",
            CauseKind::OptimizerEps => "optimizer eps too small for the precision",
            CauseKind::NormEps => "normalization eps too small",
            CauseKind::InitScale => "weights initialized too large",
            CauseKind::Precision => "half precision overflows or underflows",
            CauseKind::Device => "device-specific numerics",
            CauseKind::Threads => "thread-count-dependent numerics",
            CauseKind::NoBackward => "an op without a backward pass cuts the gradient",
            CauseKind::ModelKnob => "a model knob",
            CauseKind::AttentionScale => "attention logits without the 1/sqrt(d) scale",
            CauseKind::AttentionMask => "the attention mask makes non-finite logits",
            CauseKind::CodeBug => "a numerical bug in the model's code",
        }
    }
}

/// One cause: the causes it puts forward for a failure, each with its
/// fixes tried, its evidence and its relevance.
pub(super) trait Rule: Sync {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>>;
    /// Whether the cause can explain a failure first seen in `phase`: a
    /// batch that was bad before the model ran is no model setting's doing,
    /// and no run is spent on one.
    fn explains(&self, phase: Phase) -> bool {
        !matches!(phase, Phase::Data | Phase::Augment)
    }
}

/// Every cause, in the order their causes are put forward.
pub(super) const RULES: &[&dyn Rule] = &[
    &learning_rate::LearningRate,
    &code::CodeBug,
    &no_backward::NoBackward,
    &knob::ModelKnob,
    &data::Data,
    &augmentation::Augmentation,
    &clipping::NoClipping,
    &optimizer_eps::OptimizerEps,
    &init::InitScale,
    &loss::UnsafeLoss,
    &norm_eps::NormEps,
    &attention::AttentionMask,
    &attention::AttentionScale,
    &precision::Precision,
    &hardware::Device,
    &hardware::Threads,
];

/// A `kind` cause from the fixes it tried; none when it tried nothing.
pub(super) fn cause(
    kind: CauseKind,
    fixes: Vec<Fix>,
    evidence: Vec<String>,
    relevance: Relevance,
) -> Vec<Cause> {
    if fixes.is_empty() {
        return Vec::new();
    }
    vec![Cause::new(
        kind,
        kind.title().to_string(),
        None,
        evidence,
        fixes,
        relevance,
    )]
}

/// The variants of a `kind` cause run as fixes of the context's case.
pub(super) fn tried(
    kind: CauseKind,
    variants: Vec<Variant>,
    ctx: &Context,
    runs: &mut Runs,
) -> Result<Vec<Fix>> {
    variants
        .iter()
        .map(|v| runs.fix(kind, v, ctx.case))
        .collect()
}

/// The context's failure as evidence, when the cause fits it at its site.
pub(super) fn at_site(ctx: &Context, relevance: Relevance) -> Vec<String> {
    if relevance.at_site() {
        vec![ctx.at()]
    } else {
        Vec::new()
    }
}

/// Whether the finding is at the stage (or under the stage prefix) the knob
/// declares it acts on.
pub(super) fn at_knob_stage(knob: &KnobSpec, f: &Finding) -> bool {
    knob.stage
        .as_deref()
        .is_some_and(|s| crate::models::params::matches_path(&f.stage, s))
}

/// The code-bug cause's evidence: the explanation and the repair.
pub(super) fn code_evidence(finding: &Finding) -> Vec<String> {
    match finding.explanation.as_deref() {
        Some(e) => {
            let mut lines = vec![e.sentence.clone(), format!("the repair: {}", e.repair)];
            lines.extend(e.repair_code().map(|c| format!("as code: {c}")));
            lines
        }
        None => Vec::new(),
    }
}
