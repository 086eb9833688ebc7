//! Planted faults, one per phase: each finding must name the stage that
//! *produced* the non-finite value, not a stage downstream that propagated it.

use crate::support::sgd;
use candle_core::{Module, Tensor};
use candle_nn::{linear, Linear, VarBuilder};
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::*;
use nanhunt::{run, run_model, Finding, FindingKind, Outcome, Phase, RunOptions};

fn finding(outcome: Outcome) -> Finding {
    match outcome {
        Outcome::Unstable { finding } => *finding,
        other => panic!("expected an unstable run, got {}", other.verdict()),
    }
}

fn example(family: &str) -> Case {
    Case::example(family).unwrap()
}

fn vector_case(name: &str) -> Case {
    let mut c = example("cnn");
    c.model = ModelSpec::Custom(CustomSpec::new(name, InputSpec::Vector { features: 8 }, 4));
    c.optimizer = sgd(1e-3);
    c
}

#[test]
fn data_phase_nan_in_the_inputs() {
    let mut c = example("rnn");
    c.data.pathologies = vec![Pathology::Nan {
        fraction: 0.01,
        from_step: 3,
    }];
    let f = finding(run(&c).unwrap());
    assert_eq!(
        (f.step, f.kind, f.phase),
        (3, FindingKind::Nan, Phase::Data)
    );
    assert_eq!(f.stage, "data.pathologies[0].nan");
}

#[test]
fn augment_phase_standardizing_an_erased_image_with_zero_eps() {
    let mut c = example("cnn");
    c.augment = vec![
        Augment::GaussianNoise { std: 0.1 },
        Augment::RandomErasing {
            p: 1.0,
            scale: [1.0, 1.0],
            ratio: [1.0, 1.0],
            value: 0.0,
        },
        Augment::Normalize(NormalizeSpec::PerSample { eps: 0.0 }),
    ];
    let f = finding(run(&c).unwrap());
    assert_eq!((f.kind, f.phase), (FindingKind::Nan, Phase::Augment));
    // The erasing made the image constant; the standardization divides 0 by 0.
    assert_eq!(f.stage, "augment[2].normalize");
}

/// Three traced layers; the middle one takes the log of a shifted activation
/// that goes negative, so NaN appears there and flows into `out`.
struct LogInTheMiddle {
    first: Linear,
    out: Linear,
}

impl Model for LogInTheMiddle {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("first", self.first.forward(x)?.tanh()?)?;
        let m = tr.record("middle.log", (h - 0.5)?.log()?)?; // log of values in (-1.5, 0.5)
        tr.record("out", self.out.forward(&m)?)
    }
}

#[test]
fn forward_phase_fault_inside_a_middle_layer_of_a_user_model() {
    let c = vector_case("log_net");
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(LogInTheMiddle {
            first: linear(8, 16, vb.pp("first"))?,
            out: linear(16, 4, vb.pp("out"))?,
        }))
    };
    let f = finding(run_model(&c, &factory, &RunOptions::default()).unwrap());
    assert_eq!(
        (f.step, f.kind, f.phase),
        (0, FindingKind::Nan, Phase::Forward)
    );
    assert_eq!(
        f.stage, "middle.log",
        "the producer, not the downstream `out`"
    );
    assert_eq!(f.op.map(|o| o.kind), Some(nanhunt::OpKind::Log));
    assert!(f.stats.as_ref().unwrap().nan > 0);
}

/// Finite forward, non-finite backward: d sqrt(x)/dx = 1/(2 sqrt x) is
/// infinite at x = 0, which relu produces for every negative input.
struct SqrtOfRelu {
    hidden: Linear,
    out: Linear,
}

impl Model for SqrtOfRelu {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("hidden", self.hidden.forward(x)?.relu()?)?;
        let s = tr.record("sqrt", h.sqrt()?)?;
        tr.record("out", self.out.forward(&s)?)
    }
}

#[test]
fn backward_phase_sqrt_at_zero() {
    let c = vector_case("sqrt_net");
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(SqrtOfRelu {
            hidden: linear(8, 16, vb.pp("hidden"))?,
            out: linear(16, 4, vb.pp("out"))?,
        }))
    };
    let f = finding(run_model(&c, &factory, &RunOptions::default()).unwrap());
    // sqrt's backward yields inf; relu's backward turns it into NaN (inf · 0)
    // further down, which must not be what is reported.
    assert_eq!(
        (f.step, f.kind, f.phase),
        (0, FindingKind::Inf, Phase::Backward)
    );
    assert!(f.trace.losses[0].is_finite(), "the forward pass was finite");
    // The gradient of `hidden` is the first non-finite one; `sqrt`'s backward made it.
    assert_eq!(f.stage, "sqrt");
    assert_eq!(f.op.map(|o| o.kind), Some(nanhunt::OpKind::Sqrt));
}

#[test]
fn loss_phase_naive_cross_entropy_on_huge_logits() {
    let mut c = example("cnn");
    let ModelSpec::Cnn(m) = &mut c.model else {
        unreachable!()
    };
    for b in &mut m.blocks {
        b.batch_norm_eps = None;
    }
    c.data.scale = 1e3;
    c.loss = LossSpec::NaiveCrossEntropy { eps: 0.0 };
    let f = finding(run(&c).unwrap());
    assert_eq!(
        (f.step, f.kind, f.phase),
        (0, FindingKind::Inf, Phase::Loss)
    );
    assert_eq!(f.stage, "loss.naive_cross_entropy");
    // With the stable loss the same logits are fine.
    c.loss = LossSpec::CrossEntropy {
        label_smoothing: 0.0,
    };
    c.optimizer.set_lr(1e-9);
    c.steps = 3;
    assert_eq!(run(&c).unwrap().verdict(), "stable");
}

#[test]
fn update_phase_adam_with_zero_eps_and_a_zero_gradient() {
    // Dead ReLUs (inputs shifted far negative) have exactly zero gradients.
    let mut c = example("cnn");
    c.data.offset = -100.0;
    c.optimizer = OptimizerSpec::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 0.0,
        weight_decay: 0.0,
    };
    let f = finding(run(&c).unwrap());
    assert_eq!(
        (f.step, f.kind, f.phase),
        (0, FindingKind::Nan, Phase::Update)
    );
    assert!(f.stage.starts_with("param."), "{}", f.stage);
    let grad_norm = f.trace.grad_norms[0];
    assert!(
        grad_norm.is_finite(),
        "the gradients were finite: {grad_norm}"
    );
}

#[test]
fn f16_overflow_in_attention_scores() {
    // Unnormalized, unscaled attention with large weights: q and k stay
    // finite in f16, their dot products exceed 65504.
    let mut c = example("transformer");
    let ModelSpec::Transformer(t) = &mut c.model else {
        unreachable!()
    };
    t.norm = NormPlacement::None;
    t.attention_scale = AttentionScale::None;
    t.init.gain = 16.0;
    c.optimizer = sgd(1e-6);
    c.precision = Precision::F16;
    let f = finding(run(&c).unwrap());
    assert_eq!(
        (f.step, f.kind, f.phase),
        (0, FindingKind::Overflow, Phase::Forward)
    );
    assert_eq!(f.stage, "layer0.attn.scores");
    assert_eq!(f.signature.precision, "f16");
    // The same case in f32 trains without a non-finite value.
    c.precision = Precision::F32;
    c.steps = 5;
    assert_eq!(run(&c).unwrap().verdict(), "stable");
}

/// x / sqrt(mean(x²)) without eps is 0/0 on an all-zero sample; the ReLU
/// after it turns that NaN into 0 in the forward pass (candle's relu is
/// max(x, 0)), so the failure first surfaces as a NaN weight gradient.
struct MaskedRmsNorm {
    hidden: Linear,
    out: Linear,
}

impl Model for MaskedRmsNorm {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let rms = x.sqr()?.mean_keepdim(1)?.sqrt()?;
        let x = tr.record("rms_norm", x.broadcast_div(&rms)?)?;
        let h = tr.record("hidden", self.hidden.forward(&x)?.relu()?)?;
        tr.record("out", self.out.forward(&h)?)
    }
}

#[test]
fn a_forward_nan_masked_downstream_is_still_blamed_on_its_producer() {
    let mut c = vector_case("rms_net");
    c.data.pathologies = vec![Pathology::AllZero {
        fraction: 0.05,
        from_step: 2,
    }];
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(MaskedRmsNorm {
            hidden: linear(8, 16, vb.pp("hidden"))?,
            out: linear(16, 4, vb.pp("out"))?,
        }))
    };
    let f = finding(run_model(&c, &factory, &RunOptions::default()).unwrap());
    assert!(
        f.trace.losses.last().unwrap().is_finite(),
        "the loss itself stayed finite"
    );
    assert_eq!(
        (f.step, f.kind, f.phase),
        (2, FindingKind::Nan, Phase::Forward)
    );
    assert_eq!(f.stage, "rms_norm");
}
