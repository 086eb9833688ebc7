//! Planted bugs in users' own model code, one per numerical pattern: the
//! finding's explanation names the pattern and the stage, guarding that
//! stage for a whole run (an intervention through the tracer) trains
//! stably, and the code's cause ranks first in `diagnose`. And the labels
//! around them hold: without records a forward overflow stays an overflow,
//! a sqrt'(0) NaN under loss scaling is a NaN, `fc1` and `fc2` stay apart.

use crate::support::sgd;
use candle_core::{Module, Tensor, D};
use candle_nn::{linear, linear_no_bias, Linear, VarBuilder};
use nanhunt::diagnose::{diagnose, CauseKind, Diagnosis};
use nanhunt::explain::Pattern;
use nanhunt::models::{Model, ModelFactory, ModuleModel, Tracer};
use nanhunt::spec::*;
use nanhunt::{run_model, Finding, FindingKind, OpKind, Outcome, Phase, RunOptions};

fn custom(name: &str, input: InputSpec) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(name, input, 4));
    c.optimizer = sgd(0.05);
    c.steps = 30;
    c
}

fn vector(name: &str) -> Case {
    custom(name, InputSpec::Vector { features: 8 })
}

fn finding(case: &Case, factory: &dyn ModelFactory) -> Finding {
    match run_model(case, factory, &RunOptions::default()).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("expected a finding, got {}", other.verdict()),
    }
}

/// The planted bug's explanation, intervention and rank.
fn assert_explained(
    case: &Case,
    factory: &dyn ModelFactory,
    stage: &str,
    pattern: Pattern,
) -> Diagnosis {
    let f = finding(case, factory);
    let e = f
        .explanation
        .as_deref()
        .unwrap_or_else(|| panic!("no explanation: {f:?}"));
    assert_eq!(
        (e.stage.as_str(), e.pattern),
        (stage, pattern),
        "{}",
        e.sentence
    );
    assert!(e.sentence.contains(&format!("`{stage}`")), "{}", e.sentence);
    let d = diagnose(case, factory, &RunOptions::default()).unwrap();
    if e.formulation.is_none() && e.rewrite.is_none() {
        return unrepaired(d, stage);
    }
    let top = &d.causes[0];
    let ranked: Vec<(&str, i32, bool)> = d
        .causes
        .iter()
        .map(|c| (c.title.as_str(), c.score, c.verified()))
        .collect();
    let code: Vec<_> = d
        .causes
        .iter()
        .filter(|c| c.kind == CauseKind::CodeBug)
        .map(|c| &c.fixes[0].result)
        .collect();
    assert_eq!(top.kind, CauseKind::CodeBug, "{ranked:?} {code:?}");
    assert!(
        top.title.contains(pattern.as_str()) && top.title.contains(stage),
        "{}",
        top.title
    );
    let fix = &top.fixes[0];
    assert!(fix.verified, "{}: {}", fix.description, fix.result);
    assert_eq!(fix.intervention.as_ref().unwrap().stage, stage);
    assert!(
        top.evidence.iter().any(|l| l == &e.sentence),
        "{:?}",
        top.evidence
    );
    d
}

/// A code bug with no stable form to substitute (an accumulation past
/// f16's range: the repair is a scale or f32, a choice of the model's):
/// its cause carries the guard's diagnostic, which proves where the
/// failure comes from, and no fix — zeroing is never offered as one.
fn unrepaired(d: Diagnosis, stage: &str) -> Diagnosis {
    let code = d
        .causes
        .iter()
        .find(|c| c.kind == CauseKind::CodeBug)
        .expect("the code's cause is listed");
    assert!(code.fixes.is_empty(), "{:?}", code.fixes);
    assert!(
        code.evidence
            .iter()
            .any(|l| l.starts_with("diagnostic, not a repair")
                && l.contains(stage)
                && l.ends_with("the failure comes from there")),
        "{:?}",
        code.evidence
    );
    let zeroing = d
        .causes
        .iter()
        .flat_map(|c| &c.fixes)
        .any(|f| f.description.contains("set to 0"));
    assert!(!zeroing, "{:?}", d.causes);
    d
}

struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    fn new(vb: &VarBuilder, hidden: usize) -> candle_core::Result<Self> {
        Ok(Mlp {
            fc1: linear(8, hidden, vb.pp("fc1"))?,
            fc2: linear(hidden, 4, vb.pp("fc2"))?,
        })
    }
}

/// log(softmax(z)) with sharpened logits: the softmax underflows to 0.
struct LogOfSoftmax(Mlp);

impl Model for LogOfSoftmax {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("fc1", self.0.fc1.forward(x)?.relu()?)?;
        let z = tr.record("logits", (self.0.fc2.forward(&h)? * 60.0)?)?;
        let p = tr.record("probs", candle_nn::ops::softmax(&z, D::Minus1)?)?;
        tr.record("log_probs", p.log()?)
    }
}

#[test]
fn a_log_of_a_softmax_is_a_log_of_exact_zeros() {
    let c = vector("log_softmax");
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(LogOfSoftmax(Mlp::new(&vb, 16)?)))
    };
    let d = assert_explained(&c, &factory, "log_probs", Pattern::LogOfZero);
    assert!(
        d.causes[0].evidence[0].contains("`probs`"),
        "{:?}",
        d.causes[0].evidence
    );
}

/// h / ‖h‖ after a ReLU, without an eps: an all-zero row is 0/0.
struct RowNorm {
    fc1: Linear,
    fc2: Linear,
}

impl Model for RowNorm {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("hidden", self.fc1.forward(x)?.relu()?)?;
        let norm = h.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
        let h = tr.record("rownorm", h.broadcast_div(&norm)?)?;
        tr.record("head", self.fc2.forward(&h)?)
    }
}

#[test]
fn a_row_norm_without_eps_divides_by_a_zero_norm() {
    let mut c = vector("rownorm");
    // Zero samples stay zero through a layer without bias and a ReLU.
    c.data.pathologies = vec![Pathology::AllZero {
        fraction: 0.1,
        from_step: 0,
    }];
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(RowNorm {
            fc1: linear_no_bias(8, 16, vb.pp("fc1"))?,
            fc2: linear(16, 4, vb.pp("fc2"))?,
        }))
    };
    let d = assert_explained(&c, &factory, "rownorm", Pattern::ZeroNormRow);
    let e = &d.finding.as_ref().unwrap().explanation.as_ref().unwrap();
    assert!(e.repair.contains("eps"), "{}", e.repair);
}

/// Two copies of one block, each with the row norm's bug: the intervention
/// guards every copy (`blocks.0.rownorm` and `blocks.1.rownorm`), not only
/// the first to fail.
struct Blocks {
    blocks: Vec<Linear>,
    head: Linear,
}

impl Model for Blocks {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for (i, b) in self.blocks.iter().enumerate() {
            let a = tr.record(&format!("blocks.{i}.hidden"), b.forward(&h)?.relu()?)?;
            let norm = a.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
            h = tr.record(&format!("blocks.{i}.rownorm"), a.broadcast_div(&norm)?)?;
        }
        tr.record("head", self.head.forward(&h)?)
    }
}

#[test]
fn a_bug_in_a_repeated_block_is_guarded_in_every_copy() {
    let mut c = vector("blocks");
    c.data.pathologies = vec![Pathology::AllZero {
        fraction: 0.1,
        from_step: 0,
    }];
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let blocks = (0..2)
            .map(|i| linear_no_bias(8, 8, vb.pp(format!("blocks.{i}"))))
            .collect::<candle_core::Result<_>>()?;
        Ok(Box::new(Blocks {
            blocks,
            head: linear(8, 4, vb.pp("head"))?,
        }))
    };
    assert_explained(&c, &factory, "blocks.0.rownorm", Pattern::ZeroNormRow);
}

/// sqrt(relu(h)): finite forward, an infinite slope at 0 backward.
struct SqrtRelu(Mlp);

impl Model for SqrtRelu {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("fc1", self.0.fc1.forward(x)?)?;
        let s = tr.record("sqrt_relu", h.relu()?.sqrt()?)?;
        tr.record("head", self.0.fc2.forward(&s)?)
    }
}

fn sqrt_relu(vb: VarBuilder) -> candle_core::Result<Box<dyn Model>> {
    Ok(Box::new(SqrtRelu(Mlp::new(&vb, 16)?)))
}

#[test]
fn sqrt_of_relu_has_an_infinite_slope_at_zero_in_the_backward_pass() {
    let c = vector("sqrt_relu");
    let f = finding(&c, &sqrt_relu);
    assert_eq!((f.step, f.phase), (0, Phase::Backward));
    let d = assert_explained(&c, &sqrt_relu, "sqrt_relu", Pattern::InfiniteSlopeAtZero);
    assert_eq!(
        d.causes[0].fixes[0]
            .intervention
            .as_ref()
            .unwrap()
            .input
            .as_deref(),
        Some("fc1")
    );
}

/// A sigmoid gate written by hand, 1/(1 + exp(-h)): for h below -88 the
/// exp overflows; forward the gate is still 0, backward it is ∞/∞.
struct HandSigmoid(Mlp);

impl Model for HandSigmoid {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("fc1", self.0.fc1.forward(x)?)?;
        let e = tr.record("gate_exp", h.neg()?.exp()?)?;
        let gate = tr.record("gate", (e + 1.0)?.recip()?)?;
        tr.record("head", self.0.fc2.forward(&gate)?)
    }
}

#[test]
fn a_hand_written_sigmoid_overflows_its_exp() {
    let mut c = vector("hand_sigmoid");
    c.data.scale = 30.0;
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(HandSigmoid(Mlp::new(&vb, 16)?)))
    };
    let d = assert_explained(&c, &factory, "gate_exp", Pattern::ExpOverflow);
    assert!(
        d.causes[0].evidence[0].contains("88.7"),
        "{:?}",
        d.causes[0].evidence
    );
    // exp(-h) is repaired as exp(min(-h, 79)): the factor -1 read from its values.
    let iv = d.causes[0].fixes[0].intervention.as_ref().unwrap();
    match iv.substitute {
        Some(nanhunt::finding::Substitute::ClampedScaledExp { scale, cap }) => {
            assert!((scale + 1.0).abs() < 1e-3 && cap == 79.0, "{scale} {cap}")
        }
        ref other => panic!("{other:?}"),
    }
}

/// Self-attention over embedded tokens with an off-by-one causal mask
/// (j >= i masked instead of j > i): the first query sees no key at all.
struct OffByOneMask {
    embed: candle_nn::Embedding,
    q: Linear,
    k: Linear,
    head: Linear,
}

const SEQ: usize = 6;

impl Model for OffByOneMask {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let e = self.embed.forward(x)?;
        let q = tr.record("attn.q", self.q.forward(&e)?)?;
        let k = tr.record("attn.k", self.k.forward(&e)?)?;
        let d = q.dim(D::Minus1)?;
        let scores = tr.record("attn.scores", (q.matmul(&k.t()?)? / (d as f64).sqrt())?)?;
        let t = scores.dim(1)?;
        let mask: Vec<u8> = (0..t)
            .flat_map(|i| (0..t).map(move |j| u8::from(j >= i)))
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), x.device())?.broadcast_as(scores.shape())?;
        let neg = Tensor::full(f32::NEG_INFINITY, scores.shape(), x.device())?
            .to_dtype(scores.dtype())?;
        let masked = tr.record("attn.masked", mask.where_cond(&neg, &scores)?)?;
        let w = tr.record("attn.softmax", candle_nn::ops::softmax(&masked, D::Minus1)?)?;
        let ctx = w.matmul(&e)?.mean(1)?;
        tr.record("head", self.head.forward(&ctx)?)
    }
}

fn attention(vb: &VarBuilder, width: usize) -> candle_core::Result<OffByOneMask> {
    Ok(OffByOneMask {
        embed: candle_nn::embedding(16, width, vb.pp("embed"))?,
        q: linear(width, width, vb.pp("q"))?,
        k: linear(width, width, vb.pp("k"))?,
        head: linear(width, 4, vb.pp("head"))?,
    })
}

#[test]
fn an_off_by_one_causal_mask_leaves_a_softmax_over_a_fully_masked_row() {
    let c = custom(
        "masked_attention",
        InputSpec::Tokens {
            seq_len: SEQ,
            vocab: 16,
        },
    );
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(attention(&vb, 8)?))
    };
    assert_explained(&c, &factory, "attn.softmax", Pattern::MaskedRow);
    // PyTorch's plain softmax, the counterpart of the model's, fails too;
    // its scaled_dot_product_attention returns zeros for such a row: the
    // framework mark names the API it speaks for.
    let f = finding(&c, &factory);
    let mark = f.precision.as_ref().unwrap().framework.as_ref().unwrap();
    assert_eq!(
        (mark.verdict, mark.rule),
        (nanhunt::fidelity::FrameworkVerdict::FailsToo, None),
        "{mark:?}"
    );
    assert!(
        mark.note.contains("plain softmax") && mark.note.contains("scaled_dot_product_attention"),
        "{}",
        mark.note
    );
    crate::fidelity::assert_mark_matches_pytorch(&f, "masked_row_softmax");
}

/// q·kᵀ without 1/sqrt(d) in f16, on inputs of ~60: the sum leaves f16.
struct UnscaledAttention {
    q: Linear,
    k: Linear,
    head: Linear,
}

impl Model for UnscaledAttention {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let q = tr.record("attn.q", self.q.forward(x)?)?;
        let k = tr.record("attn.k", self.k.forward(x)?)?;
        let scores = tr.record("attn.scores", q.matmul(&k.t()?)?)?;
        let w = tr.record("attn.softmax", candle_nn::ops::softmax(&scores, D::Minus1)?)?;
        let ctx = w.matmul(x)?.mean(1)?;
        tr.record("head", self.head.forward(&ctx)?)
    }
}

#[test]
fn unscaled_attention_in_f16_overflows_its_accumulation() {
    let mut c = custom(
        "f16_attention",
        InputSpec::Sequence {
            seq_len: SEQ,
            features: 32,
        },
    );
    c.precision = Precision::F16;
    c.data.scale = 60.0;
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(UnscaledAttention {
            q: linear(32, 32, vb.pp("q"))?,
            k: linear(32, 32, vb.pp("k"))?,
            head: linear(32, 4, vb.pp("head"))?,
        }))
    };
    assert_explained(&c, &factory, "attn.scores", Pattern::AccumulationOverflow);
}

/// log of a linear output as a Poisson rate: negative rates give NaN.
struct LogRate(Mlp);

impl Model for LogRate {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("fc1", self.0.fc1.forward(x)?.relu()?)?;
        let rate = tr.record("rate", self.0.fc2.forward(&h)?)?;
        tr.record("log_rate", rate.log()?)
    }
}

#[test]
fn the_log_of_a_linear_rate_takes_logs_of_negative_values() {
    let c = vector("log_rate");
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(LogRate(Mlp::new(&vb, 16)?)))
    };
    assert_explained(&c, &factory, "log_rate", Pattern::NegativeDomain);
}

#[test]
fn without_records_a_forward_overflow_stays_an_overflow() {
    let mut c = vector("exp_plain");
    c.data.scale = 50.0;
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let fc1 = linear(8, 16, vb.pp("fc1"))?;
        let fc2 = linear(16, 4, vb.pp("fc2"))?;
        let seq = candle_nn::seq().add(fc1).add_fn(|x| x.exp()).add(fc2);
        Ok(Box::new(ModuleModel(seq)))
    };
    let f = finding(&c, &factory);
    assert_eq!(
        (f.kind, f.phase, f.stage.as_str()),
        (FindingKind::Inf, Phase::Forward, "output"),
        "{}",
        f.detail
    );
    assert!(f.detail.contains("an overflow"), "{}", f.detail);
}

#[test]
fn a_sqrt_at_zero_nan_under_loss_scaling_is_a_nan_not_a_scale_collapse() {
    let mut c = vector("sqrt_relu");
    c.precision = Precision::Mixed {
        compute: HalfType::F16,
        loss_scaling: LossScaling::default(),
    };
    let f = finding(&c, &sqrt_relu);
    assert_eq!(
        (f.kind, f.step, f.phase),
        (FindingKind::Nan, 0, Phase::Backward),
        "{}",
        f.detail
    );
    assert_eq!(f.stage, "sqrt_relu");
    assert!(f.detail.contains("no scale absorbs it"), "{}", f.detail);
    // Not "half precision overflows": f32 does not fix it, the guard does.
    let d = assert_explained(&c, &sqrt_relu, "sqrt_relu", Pattern::InfiniteSlopeAtZero);
    let precision = d.causes.iter().find(|c| c.kind == CauseKind::Precision);
    assert!(precision.is_some_and(|p| !p.verified()), "{precision:?}");
}

#[test]
fn signatures_of_a_users_layers_keep_their_digits() {
    let c = vector("sqrt_relu_plain");
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let fc1 = linear(8, 16, vb.pp("fc1"))?;
        let fc2 = linear(16, 4, vb.pp("fc2"))?;
        let seq = candle_nn::seq()
            .add(fc1)
            .add_fn(|x| x.relu()?.sqrt())
            .add(fc2);
        Ok(Box::new(ModuleModel(seq)))
    };
    let f = finding(&c, &factory);
    assert_eq!(f.signature.stage, f.stage);
    assert!(f.stage.starts_with("grad.fc1."), "{}", f.stage);
}

/// A planted bug in a user's model code: its case, its model, and the
/// stage and pattern its finding must name.
pub(crate) struct Planted {
    pub case: Case,
    pub factory: Box<dyn ModelFactory>,
    pub stage: &'static str,
    pub pattern: Pattern,
}

fn planted(
    case: Case,
    factory: impl ModelFactory + 'static,
    stage: &'static str,
    pattern: Pattern,
) -> Planted {
    Planted {
        case,
        factory: Box::new(factory),
        stage,
        pattern,
    }
}

/// q·kᵀ without 1/sqrt(d) over 32 features.
pub(crate) fn unscaled_attention(vb: VarBuilder) -> candle_core::Result<Box<dyn Model>> {
    Ok(Box::new(UnscaledAttention {
        q: linear(32, 32, vb.pp("q"))?,
        k: linear(32, 32, vb.pp("k"))?,
        head: linear(32, 4, vb.pp("head"))?,
    }))
}

/// Every planted code-bug pattern of this module, for the tests that run
/// the same bug through other drivers (`one_engine`).
pub(crate) fn planted_patterns() -> Vec<Planted> {
    let all_zero = |mut c: Case| {
        c.data.pathologies = vec![Pathology::AllZero {
            fraction: 0.1,
            from_step: 0,
        }];
        c
    };
    let mut hand_sigmoid = vector("hand_sigmoid");
    hand_sigmoid.data.scale = 30.0;
    let tokens = InputSpec::Tokens {
        seq_len: SEQ,
        vocab: 16,
    };
    let mut f16_attention = custom(
        "f16_attention",
        InputSpec::Sequence {
            seq_len: SEQ,
            features: 32,
        },
    );
    f16_attention.precision = Precision::F16;
    f16_attention.data.scale = 60.0;
    vec![
        planted(
            vector("log_softmax"),
            |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
                Ok(Box::new(LogOfSoftmax(Mlp::new(&vb, 16)?)))
            },
            "log_probs",
            Pattern::LogOfZero,
        ),
        planted(
            all_zero(vector("rownorm")),
            |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
                Ok(Box::new(RowNorm {
                    fc1: linear_no_bias(8, 16, vb.pp("fc1"))?,
                    fc2: linear(16, 4, vb.pp("fc2"))?,
                }))
            },
            "rownorm",
            Pattern::ZeroNormRow,
        ),
        planted(
            vector("sqrt_relu"),
            sqrt_relu,
            "sqrt_relu",
            Pattern::InfiniteSlopeAtZero,
        ),
        planted(
            hand_sigmoid,
            |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
                Ok(Box::new(HandSigmoid(Mlp::new(&vb, 16)?)))
            },
            "gate_exp",
            Pattern::ExpOverflow,
        ),
        planted(
            custom("masked_attention", tokens),
            |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
                Ok(Box::new(attention(&vb, 8)?))
            },
            "attn.softmax",
            Pattern::MaskedRow,
        ),
        planted(
            f16_attention,
            unscaled_attention,
            "attn.scores",
            Pattern::AccumulationOverflow,
        ),
        planted(
            vector("log_rate"),
            |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
                Ok(Box::new(LogRate(Mlp::new(&vb, 16)?)))
            },
            "log_rate",
            Pattern::NegativeDomain,
        ),
    ]
}

/// A user's cross-entropy written as -(t · log(softmax(z))) in one
/// statement, on logits that grow past what f32's exp spans: the softmax
/// underflows to exact zeros, and 0 · log(0) = NaN inside the loss stage.
/// The record before it (`probs`) holds those zeros.
fn hand_written_xent(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    let p = nanhunt::trace("probs", candle_nn::ops::softmax(logits, D::Minus1)?)?;
    let terms = (targets * p.log()?)?;
    nanhunt::trace_as(
        "xent",
        OpKind::Loss,
        terms.sum(D::Minus1)?.neg()?.mean_all()?,
    )
}

#[test]
fn target_times_log_in_one_statement_is_zero_times_the_log_of_zero() {
    let mut c = vector("xent_mlp");
    c.loss = LossSpec::Custom {
        name: "xent".into(),
        targets: TargetKind::Labels,
    };
    c.data.scale = 400.0;
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(ModuleModel(linear(8, 4, vb.pp("fc"))?)))
    };
    let opts = RunOptions::default().with_loss(std::sync::Arc::new(hand_written_xent));
    let f = match run_model(&c, &factory, &opts).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("expected a finding, got {}", other.verdict()),
    };
    let e = f.explanation.as_deref().expect("an explanation");
    assert_eq!(
        (e.stage.as_str(), e.pattern),
        ("xent", Pattern::ZeroTimesLogOfZero),
        "{}",
        e.sentence
    );
    assert_eq!(e.input.as_deref(), Some("probs"));
    assert!(e.sentence.contains("values exactly 0"), "{}", e.sentence);
    assert!(e.repair.contains("log_softmax"), "{}", e.repair);
}

/// A batch norm written by hand without eps, (h - mean) / std over the
/// batch, after a layer whose unit 0 is dead (a relu of a constant
/// negative bias): that column is constant, its std 0, and 0/0 = NaN.
struct HandBatchNorm(Linear);

impl Model for HandBatchNorm {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("h", self.0.forward(x)?.relu()?)?;
        let mean = h.mean_keepdim(0)?;
        let centered = h.broadcast_sub(&mean)?;
        let std = centered.sqr()?.mean_keepdim(0)?.sqrt()?;
        tr.record_as("bn", OpKind::Norm, centered.broadcast_div(&std)?)
    }
}

#[test]
fn a_batch_std_of_zero_on_a_constant_column_is_a_constant_normalized() {
    let c = vector("hand_bn");
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let w = vb.get_with_hints((4, 8), "fc.weight", candle_nn::init::DEFAULT_KAIMING_NORMAL)?;
        // Unit 0: weight 0 and bias -1, relu'd to exactly 0 for every sample.
        let mask = Tensor::new(&[0f32, 1.0, 1.0, 1.0], w.device())?.reshape((4, 1))?;
        let w = w.broadcast_mul(&mask)?;
        let b = Tensor::new(&[-1f32, 0.0, 0.0, 0.0], w.device())?;
        Ok(Box::new(HandBatchNorm(Linear::new(w, Some(b)))))
    };
    let f = finding(&c, &factory);
    let e = f.explanation.as_deref().expect("an explanation");
    assert_eq!(
        (e.stage.as_str(), e.pattern),
        ("bn", Pattern::ConstantNormalized),
        "{}",
        e.sentence
    );
    assert!(
        e.sentence.contains("column 0 holds 0 in all"),
        "{}",
        e.sentence
    );
    assert!(e.repair.contains("var + eps"), "{}", e.repair);
}
