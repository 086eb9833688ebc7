//! `diagnose`: the source article's five steps as an engine.
//!
//! 1. Reproduce the failure (and dump the scene).
//! 2. Scan the failing batch; re-run without augmentation and with clean data.
//! 3. Read the gradient-norm history; re-run with a lower LR and with clipping.
//! 4. Re-run with the stable variant of the loss and with larger eps values.
//! 5. Re-run in f32, on CPU, with one thread (and on the other device when
//!    built with CUDA).
//!
//! Every candidate cause comes with the changed cases that were run; a fix is
//! *verified* only when its case trained stably. Causes are ranked by whether
//! a fix was verified and by how well they match where the failure was
//! produced.

use crate::data::{HostBatch, HostInput};
use crate::differential::{compare, ArmRun, Arms, Differential, Tolerance};
use crate::error::Result;
use crate::finding::{Finding, FindingKind, Outcome, Phase, Verdict};
use crate::models::ModelFactory;
use crate::runner::RunOptions;
use crate::spec::*;
use crate::training::run_model;
use serde::Serialize;

pub use crate::spec::{case_diff, FieldChange};

mod code;

/// Values beyond this magnitude count as extreme (the article's threshold).
pub const EXTREME: f64 = 1e6;

/// The relevance from which a cause's evidence points at the failure's
/// site (the loss for a loss failure, the norm for a norm's).
const SUPPORTED: i32 = 50;

/// A `data.scale` or `data.offset` of this magnitude or more gets the
/// standardized-inputs candidate.
pub const INPUT_SCALE: f64 = 100.0;

/// What the data check saw in the failing step's batch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BatchScan {
    pub values: usize,
    pub nan: usize,
    pub inf: usize,
    /// |x| > 1e6.
    pub extreme: usize,
    pub labels_out_of_range: usize,
    /// Features (channels, sequence features) constant across the batch.
    pub constant_features: Vec<usize>,
    pub all_zero_samples: usize,
    /// Dataset indices of the samples with a NaN, Inf or extreme value, a
    /// label out of range or all zeros (batches drawn from a dataset).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_samples: Vec<usize>,
}

impl BatchScan {
    pub fn of(batch: &HostBatch) -> Self {
        let mut s = BatchScan {
            labels_out_of_range: batch
                .labels
                .iter()
                .filter(|&&l| l < 0 || l >= batch.classes as i64)
                .count(),
            ..BatchScan::default()
        };
        let rows = batch.samples.len().max(1);
        let per_label = (batch.labels.len() / rows).max(1);
        let mut bad = vec![false; batch.samples.len()];
        for (r, &l) in batch.labels.iter().enumerate() {
            if l < 0 || l >= batch.classes as i64 {
                if let Some(b) = bad.get_mut(r / per_label) {
                    *b = true;
                }
            }
        }
        let HostInput::Real { values, dims } = &batch.input else {
            s.bad_samples = flagged(&batch.samples, &bad);
            return s;
        };
        if !batch.samples.is_empty() {
            let per = values.len() / batch.samples.len();
            for (b, row) in bad.iter_mut().zip(values.chunks(per.max(1))) {
                *b |= row.iter().all(|&v| v == 0.0)
                    || row
                        .iter()
                        .any(|&v| !v.is_finite() || f64::from(v).abs() > EXTREME);
            }
            s.bad_samples = flagged(&batch.samples, &bad);
        }
        s.values = values.len();
        for &v in values {
            if v.is_nan() {
                s.nan += 1;
            } else if v.is_infinite() {
                s.inf += 1;
            } else if (v as f64).abs() > EXTREME {
                s.extreme += 1;
            }
        }
        let rows = dims[0].max(1);
        let per = values.len() / rows;
        s.all_zero_samples = values
            .chunks(per.max(1))
            .filter(|r| r.iter().all(|&v| v == 0.0))
            .count();
        // Feature f's values across the whole batch.
        let (features, stride_of): (usize, Box<dyn Fn(usize) -> Vec<f32>>) = if dims.len() == 4 {
            let (c, hw) = (dims[1], dims[2] * dims[3]);
            (
                c,
                Box::new(move |f| {
                    (0..rows)
                        .flat_map(|b| values[(b * c + f) * hw..(b * c + f + 1) * hw].to_vec())
                        .collect()
                }),
            )
        } else {
            let f = *dims.last().unwrap_or(&1);
            (
                f,
                Box::new(move |j| values.chunks(f).map(|row| row[j]).collect()),
            )
        };
        for f in 0..features {
            let v = stride_of(f);
            if v.len() > 1 && v.iter().all(|&x| x == v[0]) {
                s.constant_features.push(f);
            }
        }
        s
    }

    /// Sentences for the report (empty when the batch looks clean).
    pub fn findings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.nan > 0 {
            out.push(format!("{} NaN values in the inputs", self.nan));
        }
        if self.inf > 0 {
            out.push(format!("{} Inf values in the inputs", self.inf));
        }
        if self.extreme > 0 {
            out.push(format!("{} input values with |x| > 1e6", self.extreme));
        }
        if self.labels_out_of_range > 0 {
            out.push(format!(
                "{} labels outside the class range",
                self.labels_out_of_range
            ));
        }
        if !self.constant_features.is_empty() {
            out.push(format!("constant features {:?}", self.constant_features));
        }
        if self.all_zero_samples > 0 {
            out.push(format!("{} all-zero samples", self.all_zero_samples));
        }
        out
    }
}

fn flagged(samples: &[usize], bad: &[bool]) -> Vec<usize> {
    samples
        .iter()
        .zip(bad)
        .filter(|(_, &b)| b)
        .map(|(&s, _)| s)
        .collect()
}

/// A changed case and what happened when it ran.
#[derive(Clone, Debug, Serialize)]
pub struct Fix {
    pub description: String,
    pub changes: Vec<FieldChange>,
    /// The changed case trained stably.
    pub verified: bool,
    /// `stable`, or the signature it failed with.
    pub result: String,
    /// The stage an intervention guarded, for a fix that changes no field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intervention: Option<crate::intervention::Intervention>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    Data,
    Augmentation,
    LearningRate,
    NoClipping,
    UnsafeLoss,
    OptimizerEps,
    NormEps,
    InitScale,
    Precision,
    Device,
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

    /// How well the cause explains a finding (higher is better).
    fn relevance(self, f: &Finding) -> i32 {
        let stage = f.stage.as_str();
        let norm = f.op.is_some_and(|o| o.kind == crate::finding::OpKind::Norm);
        if f.kind == FindingKind::NoGradient {
            // Only the cut explains tensors without a gradient.
            return match self {
                CauseKind::NoBackward => 90,
                _ => 0,
            };
        }
        match self {
            CauseKind::NoBackward => 0,
            // An explained pattern at the stage that produced the failure
            // outranks what only removes its trigger (a lower LR, a smaller init).
            CauseKind::CodeBug => match f.explanation.as_deref().map(|e| e.pattern) {
                Some(crate::finding::Pattern::Unexplained) => 30,
                Some(_) => 75,
                None => 0,
            },
            // A knob's own relevance depends on its stage: see `knob_relevance`.
            CauseKind::ModelKnob => 15,
            CauseKind::AttentionMask => match f.phase {
                Phase::Forward | Phase::Backward
                    if stage.ends_with("attn.mask") || stage.ends_with("attn.softmax") =>
                {
                    63
                }
                _ => 10,
            },
            CauseKind::AttentionScale => match f.phase {
                Phase::Forward | Phase::Backward
                    if stage.ends_with("attn.scores") || stage.ends_with("attn.softmax") =>
                {
                    62
                }
                _ => 10,
            },
            CauseKind::Data => match f.phase {
                Phase::Data => 60,
                _ => 0,
            },
            CauseKind::Augmentation => match f.phase {
                Phase::Augment => 60,
                _ => 0,
            },
            CauseKind::UnsafeLoss => match f.phase {
                Phase::Loss => 60,
                Phase::Backward if stage.starts_with("loss.") => 55,
                _ => 0,
            },
            CauseKind::OptimizerEps => match f.phase {
                Phase::Update if stage.starts_with("param.") || stage.starts_with("optimizer.") => {
                    60
                }
                _ => 0,
            },
            // By kind, not by the built-in names: `ln1` has the op `ln`
            // (indices trimmed), and a user's `layer_norm` is a norm too.
            CauseKind::NormEps => match (f.phase, norm) {
                (Phase::Forward | Phase::Backward, true) => 58,
                _ => 0,
            },
            CauseKind::LearningRate => match (f.kind, f.phase) {
                (FindingKind::Divergence, _) => 60,
                (FindingKind::Explosion, _) => 58,
                (_, Phase::Update) => 25,
                _ => 10,
            },
            CauseKind::NoClipping => match (f.kind, f.phase) {
                // Clipping is the textbook answer to an exploding gradient.
                (FindingKind::Explosion, _) => 62,
                (FindingKind::Divergence, _) => 45,
                (_, Phase::Backward | Phase::Update) => 20,
                _ => 5,
            },
            CauseKind::InitScale => match f.phase {
                Phase::Forward | Phase::Backward => 30,
                _ => 10,
            },
            CauseKind::Precision => match f.kind {
                FindingKind::Overflow | FindingKind::ScaleCollapse => 59,
                _ if f.signature.precision != "f32" && f.signature.precision != "f64" => 30,
                _ => 0,
            },
            CauseKind::Device => 8,
            CauseKind::Threads => 5,
        }
    }
}

/// A candidate root cause with its evidence and the fixes that were tried.
#[derive(Clone, Debug, Serialize)]
pub struct Cause {
    pub kind: CauseKind,
    pub title: String,
    /// The declared knob a `model_knob` cause turns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub knob: Option<String>,
    pub article_step: u8,
    pub evidence: Vec<String>,
    pub fixes: Vec<Fix>,
    pub score: i32,
}

impl Cause {
    pub fn verified(&self) -> bool {
        self.fixes.iter().any(|f| f.verified)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Diagnosis {
    /// The failure being diagnosed; `None` when the case trained stably.
    pub finding: Option<Finding>,
    /// Step 2: the failing batch before and after augmentation.
    pub batch_raw: Option<BatchScan>,
    pub batch_augmented: Option<BatchScan>,
    /// Step 2 over the whole dataset (cases that draw from one): the scan
    /// of every sample the case draws.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<crate::data::scan::DataScan>,
    /// Step 3: the gradient norm's growth over the run, last / first.
    pub grad_norm_growth: Option<f64>,
    /// Ranked, best explanation first.
    pub causes: Vec<Cause>,
    /// How many of the first causes are supported: a verified fix, or
    /// evidence at the failure's site. The rest were tried and ruled out;
    /// with 0, nothing explains the failure yet.
    pub supported: usize,
    /// Step 5: the case compared step by step across devices (CPU and
    /// CUDA, when CUDA is compiled in) or else across thread counts.
    pub hardware: Option<crate::differential::Differential>,
    /// Training runs spent, the reproduction included.
    pub runs: usize,
}

impl Diagnosis {
    pub fn verified_causes(&self) -> impl Iterator<Item = &Cause> {
        self.causes.iter().filter(|c| c.verified())
    }
}

/// A candidate: a cause and a changed case that would rule it in or out.
struct Variant {
    kind: CauseKind,
    /// The declared knob it turns (a cause per knob).
    knob: Option<String>,
    description: String,
    case: Case,
    /// Run under a one-thread pool.
    one_thread: bool,
}

fn variant(
    kind: CauseKind,
    description: impl Into<String>,
    base: &Case,
    change: impl FnOnce(&mut Case),
) -> Variant {
    let mut case = base.clone();
    change(&mut case);
    Variant {
        kind,
        knob: None,
        description: description.into(),
        case,
        one_thread: false,
    }
}

/// The stable counterpart of a loss, if it has one.
pub fn stable_loss(loss: &LossSpec) -> Option<LossSpec> {
    Some(match *loss {
        LossSpec::NaiveCrossEntropy { .. } | LossSpec::Nll => LossSpec::CrossEntropy {
            label_smoothing: 0.0,
        },
        LossSpec::Bce { .. } => LossSpec::BceWithLogits,
        LossSpec::LogOneMinus { eps } if eps < 1e-7 => LossSpec::LogOneMinus { eps: 1e-7 },
        LossSpec::KlDiv { eps } if eps < 1e-8 => LossSpec::KlDiv { eps: 1e-8 },
        LossSpec::Mse { root: true, eps } if eps < 1e-8 => LossSpec::Mse {
            root: true,
            eps: 1e-8,
        },
        LossSpec::PoissonNll {
            log_input: false,
            eps,
        } if eps < 1e-8 => LossSpec::PoissonNll {
            log_input: false,
            eps: 1e-8,
        },
        _ => return None,
    })
}

/// The changed cases worth running for a finding; `bad` are the dataset
/// samples the data check flags. The learning rate is searched separately
/// ([`lr_search`]).
fn variants(case: &Case, finding: &Finding, bad: &[usize]) -> Vec<Variant> {
    let mut out = Vec::new();
    if let Some(cov) = &finding.coverage {
        if matches!(case.model, ModelSpec::Custom(_)) {
            let frozen = cov.frozen_names();
            out.push(variant(
                CauseKind::NoBackward,
                format!(
                    "train only what the gradient reaches: declare the {} tensors without one frozen (a workaround; replacing the op trains them all)",
                    frozen.len()
                ),
                case,
                |c| {
                    if let Some(f) = c.model.frozen_mut() {
                        f.extend(frozen);
                    }
                },
            ));
        }
    }
    for (name, knob) in case.model.knobs().into_iter().flatten() {
        for value in knob.candidates(KNOB_CANDIDATES) {
            let mut v = variant(
                CauseKind::ModelKnob,
                format!("model knob `{name}` {:e} -> {value:e}", knob.value),
                case,
                |c| {
                    if let Some(k) = c.model.knobs_mut().and_then(|k| k.get_mut(name)) {
                        k.value = value;
                    }
                },
            );
            v.knob = Some(name.clone());
            out.push(v);
        }
    }
    // Step 2: data and augmentation.
    if !bad.is_empty() {
        out.push(variant(
            CauseKind::Data,
            format!(
                "the data without the {} samples the data check flags ({})",
                bad.len(),
                crate::data::samples_phrase(bad)
            ),
            case,
            |c| {
                if let Some(s) = c.data.source.sampling_mut() {
                    s.exclude.extend_from_slice(bad);
                    s.exclude.sort_unstable();
                    s.exclude.dedup();
                }
            },
        ));
    }
    if !case.data.pathologies.is_empty() {
        out.push(variant(
            CauseKind::Data,
            "clean data: no injected pathologies",
            case,
            |c| c.data.pathologies.clear(),
        ));
    }
    if case.data.scale.abs() >= INPUT_SCALE || case.data.offset.abs() >= INPUT_SCALE {
        out.push(variant(
            CauseKind::Data,
            "inputs standardized to unit scale",
            case,
            |c| {
                c.data.scale = 1.0;
                c.data.offset = 0.0;
            },
        ));
    }
    if !case.augment.is_empty() {
        out.push(variant(
            CauseKind::Augmentation,
            "augmentation off",
            case,
            |c| c.augment.clear(),
        ));
        for (i, a) in case.augment.iter().enumerate() {
            if let Augment::Normalize(NormalizeSpec::PerSample { eps }) = a {
                if *eps < 1e-5 {
                    out.push(variant(
                        CauseKind::Augmentation,
                        format!("augment[{i}] (normalize) eps 1e-5"),
                        case,
                        |c| {
                            c.augment[i] =
                                Augment::Normalize(NormalizeSpec::PerSample { eps: 1e-5 })
                        },
                    ));
                }
            }
        }
    }
    // Step 3: gradients and the optimizer.
    if !matches!(case.clip, ClipSpec::Norm { max_norm } if max_norm <= 1.0) {
        out.push(variant(
            CauseKind::NoClipping,
            "clip the gradient norm to 1.0",
            case,
            |c| c.clip = ClipSpec::Norm { max_norm: 1.0 },
        ));
    }
    let half_master = matches!(case.precision, Precision::F16 | Precision::Bf16);
    let safe_eps = if half_master { 1e-4 } else { 1e-8 };
    if let Some(eps) = case.optimizer.eps().filter(|&e| e < safe_eps) {
        out.push(variant(
            CauseKind::OptimizerEps,
            format!("optimizer eps {eps:e} -> {safe_eps:e}"),
            case,
            |c| {
                if let Some(eps) = c.optimizer.eps_mut() {
                    *eps = safe_eps;
                }
            },
        ));
    }
    if case.model.init().gain > 2.0 {
        out.push(variant(CauseKind::InitScale, "init gain 1.0", case, |c| {
            c.model.init_mut().gain = 1.0
        }));
    }
    // Step 4: the loss and normalization eps values.
    if let Some(stable) = stable_loss(&case.loss) {
        out.push(variant(
            CauseKind::UnsafeLoss,
            format!("loss {} -> {}", case.loss.describe(), stable.describe()),
            case,
            |c| c.loss = stable,
        ));
    }
    match &case.model {
        ModelSpec::Cnn(m)
            if m.blocks
                .iter()
                .any(|b| b.batch_norm_eps.is_some_and(|e| e < 1e-5)) =>
        {
            out.push(variant(
                CauseKind::NormEps,
                "batch-norm eps 1e-5",
                case,
                |c| {
                    if let ModelSpec::Cnn(m) = &mut c.model {
                        for b in &mut m.blocks {
                            if let Some(e) = &mut b.batch_norm_eps {
                                *e = e.max(1e-5);
                            }
                        }
                    }
                },
            ));
        }
        ModelSpec::Transformer(t) if t.norm != NormPlacement::None && t.norm_eps < 1e-5 => {
            out.push(variant(
                CauseKind::NormEps,
                "layer-norm eps 1e-5",
                case,
                |c| {
                    if let ModelSpec::Transformer(t) = &mut c.model {
                        t.norm_eps = 1e-5;
                    }
                },
            ));
        }
        ModelSpec::Decoder(d) if d.rms_eps < 1e-5 => {
            out.push(variant(
                CauseKind::NormEps,
                "RMS-norm eps 1e-5",
                case,
                |c| {
                    if let ModelSpec::Decoder(d) = &mut c.model {
                        d.rms_eps = 1e-5;
                    }
                },
            ));
        }
        _ => {}
    }
    if let ModelSpec::Encoder(e) = &case.model {
        let finite = MaskKind::default();
        if e.mask != finite {
            out.push(variant(
                CauseKind::AttentionMask,
                "a finite additive mask (-1e4, which f16 holds) instead of -inf or f32::MIN",
                case,
                |c| {
                    if let ModelSpec::Encoder(e) = &mut c.model {
                        e.mask = finite;
                    }
                },
            ));
        }
        if e.min_length == 0 {
            out.push(variant(
                CauseKind::AttentionMask,
                "no sample of padding only (min_length 1): no fully masked attention row",
                case,
                |c| {
                    if let ModelSpec::Encoder(e) = &mut c.model {
                        e.min_length = 1;
                    }
                },
            ));
        }
    }
    if case.model.attention_scale() == Some(AttentionScale::None) {
        out.push(variant(
            CauseKind::AttentionScale,
            "attention logits scaled by 1/sqrt(head width)",
            case,
            |c| c.model.set_attention_scale(AttentionScale::InvSqrtD),
        ));
    }
    // Step 5: precision, device, threads.
    if !matches!(case.precision, Precision::F32 | Precision::F64) {
        out.push(variant(CauseKind::Precision, "precision f32", case, |c| {
            c.precision = Precision::F32
        }));
        if let Precision::F16 = case.precision {
            out.push(variant(
                CauseKind::Precision,
                "mixed precision (f32 master weights, dynamic loss scaling)",
                case,
                |c| {
                    c.precision = Precision::Mixed {
                        compute: HalfType::F16,
                        loss_scaling: LossScaling::default(),
                    }
                },
            ));
        }
    }
    match case.device {
        DeviceSpec::Cuda(_) => out.push(variant(CauseKind::Device, "run on CPU", case, |c| {
            c.device = DeviceSpec::Cpu
        })),
        DeviceSpec::Cpu if crate::device::cuda_usable() => {
            out.push(variant(CauseKind::Device, "run on cuda:0", case, |c| {
                c.device = DeviceSpec::Cuda(0)
            }))
        }
        DeviceSpec::Cpu => {}
    }
    let mut one = variant(CauseKind::Threads, "one compute thread", case, |_| {});
    one.one_thread = true;
    out.push(one);
    out
}

/// Values tried per declared model knob.
pub const KNOB_CANDIDATES: usize = 5;

/// Decades the learning-rate search goes down at most.
pub const LR_SEARCH_DECADES: i32 = 8;

/// Searches down from the case's learning rate by factors of 10 to the
/// first LR that trains stably, then narrows the last decade twice (halving
/// it in log scale) towards the highest stable LR. Every LR tried is a fix,
/// verified or not.
fn lr_search(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
    runs: &mut usize,
) -> Result<Vec<Fix>> {
    let lr = case.optimizer.lr();
    let mut tried: Vec<(f64, Fix)> = Vec::new();
    if lr <= 0.0 {
        return Ok(Vec::new());
    }
    let mut try_lr = |to: f64, tried: &mut Vec<(f64, Fix)>| -> Result<bool> {
        let mut c = case.clone();
        c.optimizer.set_lr(to);
        let outcome = run_model(&c, factory, opts)?;
        *runs += 1;
        let verified = matches!(outcome, Outcome::Stable { .. });
        tried.push((
            to,
            Fix {
                description: format!("learning rate {lr:e} -> {to:e}"),
                changes: case_diff(case, &c),
                verified,
                result: result_text(&outcome),
                intervention: None,
            },
        ));
        Ok(verified)
    };
    let (mut unstable, mut stable) = (lr, None);
    for decade in 1..=LR_SEARCH_DECADES {
        // Printed and parsed back: 3e-3 / 10 is 3e-4, not 3.0000000000000003e-4.
        let to: f64 = format!("{:.6e}", lr / 10f64.powi(decade))
            .parse()
            .expect("a formatted float");
        if try_lr(to, &mut tried)? {
            stable = Some(to);
            break;
        }
        unstable = to;
    }
    if let Some(mut s) = stable {
        for _ in 0..2 {
            let mid = crate::spec::round1((unstable * s).sqrt());
            if mid <= s || mid >= unstable {
                break;
            }
            if try_lr(mid, &mut tried)? {
                s = mid;
            } else {
                unstable = mid;
            }
        }
    }
    // The highest stable LR first; the unstable ones after it, as tried.
    tried.sort_by(|(la, a), (lb, b)| {
        b.verified
            .cmp(&a.verified)
            .then(if a.verified && b.verified {
                lb.total_cmp(la)
            } else {
                std::cmp::Ordering::Equal
            })
    });
    Ok(tried.into_iter().map(|(_, f)| f).collect())
}

fn run_variant(v: &Variant, factory: &dyn ModelFactory, opts: &RunOptions) -> Result<Outcome> {
    if v.one_thread {
        crate::device::cpu_pool(1)?.install(|| run_model(&v.case, factory, opts))
    } else {
        run_model(&v.case, factory, opts)
    }
}

/// The differential arm that already ran a variant's case: the one-thread
/// arm, or the arm on the variant's device.
fn arm_for<'d>(v: &Variant, hardware: &'d Differential) -> Option<&'d ArmRun> {
    hardware.arms.iter().find(|a| {
        if v.one_thread {
            a.threads == Some(1)
        } else {
            v.kind == CauseKind::Device && a.threads.is_none() && a.device == v.case.device
        }
    })
}

fn arm_text(a: &ArmRun) -> String {
    match &a.signature {
        Some(s) => format!("unstable: {}", s.slug()),
        None => "stable".into(),
    }
}

fn result_text(o: &Outcome) -> String {
    match o {
        Outcome::Stable { .. } => "stable".into(),
        Outcome::Unstable { finding } => format!("unstable: {}", finding.signature.slug()),
        Outcome::Rejected { reason } => format!("rejected: {reason}"),
    }
}

/// Diagnoses a case: reproduces it (dumping the scene when `opts.dump` is
/// set), gathers evidence and runs the fix candidates.
pub fn diagnose(case: &Case, factory: &dyn ModelFactory, opts: &RunOptions) -> Result<Diagnosis> {
    let outcome = run_model(case, factory, opts)?;
    let mut runs = 1;
    let finding = match outcome {
        Outcome::Unstable { finding } => *finding,
        Outcome::Rejected { reason } => return Err(crate::error::Error::Rejected(reason)),
        Outcome::Stable { .. } => {
            return Ok(Diagnosis {
                finding: None,
                dataset: None,
                batch_raw: None,
                batch_augmented: None,
                grad_norm_growth: None,
                causes: Vec::new(),
                supported: 0,
                hardware: None,
                runs,
            })
        }
    };
    let case = case.on(opts.device);

    // Step 2: the failing step's batch, before and after augmentation, and
    // every sample of a dataset the case draws from.
    let max = opts.limits.max_memory_bytes;
    let case = crate::data::pinned(&case, max)?;
    let source = crate::data::open_source(&case, opts.dataset.as_ref(), max)?;
    let mut raw = source.batch(finding.step, case.batch_size)?;
    crate::data::apply_pathologies(&mut raw, &case.data.pathologies, case.seed, finding.step);
    let dataset = match (source.dataset(), case.data.source.sampling()) {
        (Some(d), Some(sampling)) => {
            let drawn = crate::data::kept_samples(sampling, d.len())
                .map_err(|r| crate::error::Error::invalid("data.source.sampling", r))?;
            let opts = crate::data::scan::ScanOptions {
                classes: Some(case.model.classes()),
                extreme: EXTREME,
                max_listed: usize::MAX,
            };
            Some(crate::data::scan::scan_dataset(&**d, Some(&drawn), &opts)?)
        }
        _ => None,
    };
    let bad = dataset
        .as_ref()
        .map(crate::data::scan::DataScan::bad_samples)
        .unwrap_or_default();
    let mut augmented = raw.clone();
    crate::augment::apply_all(&mut augmented, &case.augment, case.seed, finding.step);
    let (scan_raw, scan_aug) = (BatchScan::of(&raw), BatchScan::of(&augmented));

    // Step 3: gradient-norm growth before the failure.
    let norms: Vec<f64> = finding
        .trace
        .grad_norms
        .iter()
        .copied()
        .filter(|n| n.is_finite())
        .collect();
    let growth = match (norms.first(), norms.last()) {
        (Some(&a), Some(&b)) if norms.len() > 1 && a > 0.0 => Some(b / a),
        _ => None,
    };

    let run_opts = RunOptions {
        dump: None,
        dump_at: None,
        device: None,
        fidelity: false,
        ..opts.clone()
    };
    // Step 5, differential: where do devices (or thread counts) part ways?
    // Its arms also answer the device and thread variants below.
    let arms = match case.device {
        DeviceSpec::Cuda(i) => Arms::Devices(vec![DeviceSpec::Cpu, DeviceSpec::Cuda(i)]),
        DeviceSpec::Cpu if crate::device::cuda_usable() => {
            Arms::Devices(vec![DeviceSpec::Cpu, DeviceSpec::Cuda(0)])
        }
        DeviceSpec::Cpu => {
            let n = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
            Arms::Threads(vec![1, n])
        }
    };
    let hardware = compare(
        &case,
        Some(factory),
        &arms,
        Tolerance::default_for(&arms, &case),
        &run_opts,
    )?;
    runs += hardware.arms.len();

    let mut causes: Vec<Cause> = Vec::new();
    // No update has run before a failure at step 0 outside the update:
    // the learning rate cannot have caused it.
    let before_any_update = finding.step == 0 && finding.phase != Phase::Update;
    if finding.kind != FindingKind::NoGradient && !before_any_update {
        let fixes = lr_search(&case, factory, &run_opts, &mut runs)?;
        if !fixes.is_empty() {
            causes.push(Cause {
                kind: CauseKind::LearningRate,
                title: CauseKind::LearningRate.title().to_string(),
                knob: None,
                article_step: CauseKind::LearningRate.article_step(),
                evidence: Vec::new(),
                fixes,
                score: 0,
            });
        }
    }
    if let Some(c) = code::cause(&case, &finding, factory, &run_opts, &mut runs)? {
        causes.push(c);
    }
    for v in variants(&case, &finding, &bad) {
        let (verified, result) = match arm_for(&v, &hardware) {
            Some(arm) => (arm.verdict == Verdict::Stable, arm_text(arm)),
            None => {
                let outcome = run_variant(&v, factory, &run_opts)?;
                runs += 1;
                (
                    matches!(outcome, Outcome::Stable { .. }),
                    result_text(&outcome),
                )
            }
        };
        let fix = Fix {
            description: v.description.clone(),
            changes: case_diff(&case, &v.case),
            verified,
            result,
            intervention: None,
        };
        match causes
            .iter_mut()
            .find(|c| c.kind == v.kind && c.knob == v.knob)
        {
            Some(c) => c.fixes.push(fix),
            None => causes.push(Cause {
                kind: v.kind,
                title: match &v.knob {
                    Some(name) => format!("the model knob `{name}`"),
                    None => v.kind.title().to_string(),
                },
                knob: v.knob.clone(),
                article_step: v.kind.article_step(),
                evidence: Vec::new(),
                fixes: vec![fix],
                score: 0,
            }),
        }
    }

    for c in &mut causes {
        c.evidence = evidence(c.kind, &finding, &case, &scan_raw, &scan_aug, growth);
        let knob = c.knob.as_deref().and_then(|n| knob_of(n, &case));
        if let Some(knob) = knob {
            c.evidence.extend(knob_evidence(knob, &finding));
        }
        if c.kind == CauseKind::Data {
            c.evidence
                .extend(dataset_evidence(dataset.as_ref(), &scan_raw));
        }
        // The code's explanation: its own cause, or the knob's at that stage.
        let knob_at_stage = knob.is_some_and(|(_, k)| at_knob_stage(k, &finding));
        if c.kind == CauseKind::CodeBug || knob_at_stage {
            c.evidence.extend(code::evidence(&finding));
        }
        let relevance = match knob {
            Some(knob) => knob_relevance(knob, &finding),
            None => c.kind.relevance(&finding),
        };
        // Threads and device only matter when their variant changes the verdict.
        let informative = !matches!(c.kind, CauseKind::Threads | CauseKind::Device) || c.verified();
        c.score = if informative {
            relevance + if c.verified() { 100 } else { 0 }
        } else {
            0
        };
    }
    let supported = rank(&mut causes);

    Ok(Diagnosis {
        hardware: Some(hardware),
        finding: Some(finding),
        dataset,
        batch_raw: Some(scan_raw),
        batch_augmented: Some(scan_aug),
        grad_norm_growth: growth,
        causes,
        supported,
        runs,
    })
}

/// Best explanation first: causes with a verified fix or evidence at the
/// failure's site (a score of at least [`SUPPORTED`]) before the rest, then
/// by score, then by the article's order. A cause with neither never ranks
/// first, however little else there is.
/// Returns how many lead the list supported.
fn rank(causes: &mut [Cause]) -> usize {
    let supported = |c: &Cause| c.verified() || c.score >= SUPPORTED;
    causes.sort_by(|a, b| {
        supported(b)
            .cmp(&supported(a))
            .then(b.score.cmp(&a.score))
            .then(a.article_step.cmp(&b.article_step))
    });
    causes.iter().take_while(|c| supported(c)).count()
}

/// A declared knob by name, with its spec.
fn knob_of<'c>(name: &str, case: &'c Case) -> Option<(&'c str, &'c KnobSpec)> {
    case.model
        .knobs()?
        .get_key_value(name)
        .map(|(n, k)| (n.as_str(), k))
}

/// Whether the finding is at the stage (or under the stage prefix) the knob
/// declares it acts on.
fn at_knob_stage(knob: &KnobSpec, f: &Finding) -> bool {
    knob.stage
        .as_deref()
        .is_some_and(|s| crate::models::params::matches_path(&f.stage, s))
}

/// A knob explains a finding at the stage it declares it acts on (65,
/// as the loss fits a loss failure), an eps knob a norm's failure (50);
/// else it is a weak suspect.
fn knob_relevance((name, knob): (&str, &KnobSpec), f: &Finding) -> i32 {
    let norm = f.op.is_some_and(|o| o.kind == crate::finding::OpKind::Norm);
    match (at_knob_stage(knob, f), norm && name.contains("eps")) {
        (true, _) => 65,
        (false, true) => 50,
        _ => CauseKind::ModelKnob.relevance(f),
    }
}

fn knob_evidence((name, knob): (&str, &KnobSpec), f: &Finding) -> Vec<String> {
    let mut e = vec![format!(
        "the model declares knob `{name}` = {:e} (range [{:e}, {:e}])",
        knob.value, knob.min, knob.max
    )];
    if at_knob_stage(knob, f) {
        e.push(format!(
            "the failure is {} in {} at `{}`, the stage the knob acts on",
            f.kind.as_str(),
            f.phase.as_str(),
            f.stage
        ));
    }
    e
}

/// The gradient norm's change over the run (last / first), in words that
/// say which way it went.
pub fn growth_phrase(g: f64) -> String {
    if g >= 1.0 {
        format!("the gradient norm grew {g:.3e}x before the failure")
    } else {
        format!("the gradient norm fell to {g:.3e} of its first value before the failure (it did not grow)")
    }
}

/// What the whole-dataset scan and the failing batch's samples say.
fn dataset_evidence(scan: Option<&crate::data::scan::DataScan>, batch: &BatchScan) -> Vec<String> {
    let mut e = Vec::new();
    if let Some(scan) = scan {
        for p in scan.problems.iter().filter(|p| p.kind.is_error()) {
            e.push(format!(
                "{} of the {} samples of {} have {}: {}",
                p.count,
                scan.samples,
                scan.dataset,
                p.detail,
                crate::data::samples_phrase(&p.indices)
            ));
        }
    }
    if !batch.bad_samples.is_empty() {
        e.push(format!(
            "the failing batch holds {}",
            crate::data::samples_phrase(&batch.bad_samples)
        ));
    }
    e
}

fn evidence(
    kind: CauseKind,
    f: &Finding,
    case: &Case,
    raw: &BatchScan,
    aug: &BatchScan,
    growth: Option<f64>,
) -> Vec<String> {
    let mut e = Vec::new();
    let at = format!(
        "the failure is {} in {} at `{}`",
        f.kind.as_str(),
        f.phase.as_str(),
        f.stage
    );
    match kind {
        CauseKind::Data => {
            e.extend(
                raw.findings()
                    .into_iter()
                    .map(|s| format!("batch before augmentation: {s}")),
            );
            if case.data.scale.abs() >= INPUT_SCALE || case.data.offset.abs() >= INPUT_SCALE {
                e.push(format!(
                    "the inputs are scaled by {:e} with offset {:e}: activations and logits grow with them",
                    case.data.scale, case.data.offset
                ));
            }
            if !case.data.pathologies.is_empty() {
                let names: Vec<&str> = case.data.pathologies.iter().map(|p| p.name()).collect();
                e.push(format!(
                    "the data carries injected pathologies: {}",
                    names.join(", ")
                ));
            }
            if f.phase == Phase::Data {
                e.push(at);
            }
        }
        CauseKind::Augmentation => {
            let before = raw.nan + raw.inf;
            let after = aug.nan + aug.inf;
            if after > before {
                e.push(format!(
                    "augmentation turns {before} non-finite input values into {after}"
                ));
            }
            if f.phase == Phase::Augment {
                e.push(at);
            }
        }
        CauseKind::LearningRate | CauseKind::NoClipping => {
            if let Some(g) = growth {
                e.push(growth_phrase(g));
            }
            if matches!(f.kind, FindingKind::Divergence | FindingKind::Explosion) {
                e.push(f.detail.clone());
            }
            e.push(format!("learning rate {:e}", case.optimizer.lr()));
        }
        CauseKind::UnsafeLoss
        | CauseKind::NormEps
        | CauseKind::OptimizerEps
        | CauseKind::InitScale
        | CauseKind::AttentionScale
        | CauseKind::AttentionMask => {
            if kind.relevance(f) >= 50 {
                e.push(at);
            }
        }
        CauseKind::Precision => {
            e.push(format!("precision {}", case.precision.name()));
            if matches!(f.kind, FindingKind::Overflow | FindingKind::ScaleCollapse) {
                e.push(at);
            }
        }
        CauseKind::NoBackward => {
            if let Some(cov) = &f.coverage {
                e.push(cov.summary());
            }
        }
        CauseKind::Device | CauseKind::Threads | CauseKind::ModelKnob | CauseKind::CodeBug => {}
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_names_changed_fields_only() {
        let a = Case::example("cnn").unwrap();
        let mut b = a.clone();
        b.optimizer.set_lr(1e-4);
        b.clip = ClipSpec::Norm { max_norm: 1.0 };
        let d = case_diff(&a, &b);
        let paths: Vec<&str> = d.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, vec!["clip", "optimizer.lr"]);
    }

    fn cause(kind: CauseKind, score: i32, verified: bool) -> Cause {
        Cause {
            kind,
            title: kind.title().into(),
            knob: None,
            article_step: kind.article_step(),
            evidence: Vec::new(),
            fixes: vec![Fix {
                description: String::new(),
                changes: Vec::new(),
                verified,
                result: String::new(),
                intervention: None,
            }],
            score,
        }
    }

    #[test]
    fn a_cause_without_evidence_or_a_verified_fix_never_ranks_first() {
        // Scores as diagnose gives them: unverified guesses away from the
        // failure's site (an LR for a forward NaN: 10, clipping: 20), the
        // unverified loss cause at its site (60).
        let mut causes = vec![
            cause(CauseKind::LearningRate, 10, false),
            cause(CauseKind::NoClipping, 20, false),
            cause(CauseKind::UnsafeLoss, 60, false),
        ];
        assert_eq!(rank(&mut causes), 1);
        assert_eq!(causes[0].kind, CauseKind::UnsafeLoss);
        // Nothing supported: the list says so (no cause leads it).
        let mut guesses = vec![
            cause(CauseKind::LearningRate, 25, false),
            cause(CauseKind::InitScale, 30, false),
        ];
        assert_eq!(rank(&mut guesses), 0);
        // Verified fixes and an explained code bug, by score.
        let mut causes = vec![
            cause(CauseKind::InitScale, 30, false),
            cause(CauseKind::LearningRate, 110, true),
            cause(CauseKind::CodeBug, 175, true),
        ];
        assert_eq!(rank(&mut causes), 2);
        let kinds: Vec<CauseKind> = causes.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                CauseKind::CodeBug,
                CauseKind::LearningRate,
                CauseKind::InitScale
            ]
        );
    }

    #[test]
    fn the_gradient_norm_evidence_says_which_way_it_went() {
        assert!(growth_phrase(12.0).contains("grew 1.200e1x"));
        let fell = growth_phrase(0.3282);
        assert!(
            fell.contains("fell to 3.282e-1") && !fell.contains("grew"),
            "{fell}"
        );
    }

    #[test]
    fn the_input_scale_candidate_starts_at_100() {
        let mut c = Case::example("cnn").unwrap();
        c.data.scale = INPUT_SCALE;
        let f = match crate::run(&{
            let mut broken = c.clone();
            broken.optimizer.set_lr(1e6);
            broken
        })
        .unwrap()
        {
            Outcome::Unstable { finding } => *finding,
            other => panic!("{other:?}"),
        };
        let has = |c: &Case| {
            variants(c, &f, &[])
                .iter()
                .any(|v| v.description == "inputs standardized to unit scale")
        };
        assert!(has(&c));
        c.data.scale = 99.0;
        assert!(!has(&c));
    }

    #[test]
    fn batch_scan_sees_constant_features_and_zero_samples() {
        let mut c = Case::example("cnn").unwrap();
        c.data.pathologies = vec![
            Pathology::ConstantFeature {
                feature: 2,
                value: 0.0,
                from_step: 0,
            },
            Pathology::AllZero {
                fraction: 0.25,
                from_step: 0,
            },
        ];
        let b = crate::data::Generator::new(&c).data_batch(0, 8);
        let s = BatchScan::of(&b);
        assert_eq!(s.constant_features, vec![2]);
        assert_eq!(s.all_zero_samples, 2);
    }
}
