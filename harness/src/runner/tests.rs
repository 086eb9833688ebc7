//! Whole runs: every family learns, runs are bit-reproducible, and the probe
//! finds real instabilities (not only planted ones), each at the right phase.
//! One planted fault per phase, with its producer, is in the integration
//! suite (`tests/integration/planted.rs`).

use super::*;
use crate::finding::{Outcome, Phase};
use crate::models::BuiltinFactory;
use crate::models::{Model, ModuleModel};
use crate::spec::*;
use crate::training::{run, run_model};

fn example(family: &str) -> Case {
    Case::example(family).unwrap()
}

fn stable_trace(case: &Case) -> Trace {
    match run(case).unwrap() {
        Outcome::Stable { trace } => trace,
        other => panic!("expected a stable run, got {other:?}"),
    }
}

fn finding(case: &Case) -> Finding {
    match run(case).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("expected an unstable run, got {other:?}"),
    }
}

/// A CNN without batch-norm (so input scale reaches the logits) and a tiny
/// SGD step, so that only the numerics can fail.
fn raw_cnn(scale: f64) -> Case {
    let mut c = example("cnn");
    let ModelSpec::Cnn(m) = &mut c.model else {
        unreachable!()
    };
    for b in &mut m.blocks {
        b.batch_norm_eps = None;
    }
    c.data.scale = scale;
    c.optimizer = OptimizerSpec::Sgd {
        lr: 1e-9,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    c.steps = 3;
    c
}

#[test]
fn every_family_learns_its_task() {
    for family in FAMILIES {
        let t = stable_trace(&example(family));
        let first = t.losses[0];
        let last5 = t.losses[t.losses.len() - 5..].iter().sum::<f64>() / 5.0;
        // "Clearly below": the last five steps average under 60% of the start.
        assert!(last5 < 0.6 * first, "{family}: {first} -> {last5}");
    }
}

#[test]
fn same_case_gives_bit_identical_histories() {
    for family in FAMILIES {
        let mut c = example(family);
        c.steps = 10;
        let (a, b) = (stable_trace(&c), stable_trace(&c));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.losses), bits(&b.losses), "{family}");
        assert_eq!(bits(&a.grad_norms), bits(&b.grad_norms), "{family}");
    }
}

#[test]
fn sgd_with_a_huge_learning_rate_diverges() {
    let mut c = example("cnn");
    c.optimizer = OptimizerSpec::Sgd {
        lr: 50.0,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let f = finding(&c);
    assert!(
        matches!(
            f.kind,
            FindingKind::Divergence | FindingKind::Nan | FindingKind::Inf
        ),
        "{f:?}"
    );
    // The same case at the default LR is stable.
    c.optimizer.set_lr(1e-2);
    stable_trace(&c);
}

#[test]
fn f16_overflows_where_f32_does_not() {
    let mut c = raw_cnn(8e3);
    stable_trace(&c);
    c.precision = Precision::F16;
    let f = finding(&c);
    assert_eq!(f.step, 0);
    assert_eq!(f.phase, Phase::Forward, "{f:?}");
    assert!(
        matches!(f.kind, FindingKind::Overflow | FindingKind::Nan),
        "{f:?}"
    );
}

#[test]
fn half_precision_inputs_out_of_range_are_a_data_overflow() {
    let mut c = raw_cnn(2e4);
    c.precision = Precision::F16;
    let f = finding(&c);
    // The generator's scaled values are the first to exceed f16's range.
    assert_eq!(
        (f.kind, f.phase, f.stage.as_str()),
        (FindingKind::Overflow, Phase::Data, "data.generator")
    );
}

#[test]
fn nan_in_the_data_is_caught_at_step_zero() {
    let mut c = example("rnn");
    c.data.pathologies = vec![Pathology::Nan {
        fraction: 0.001,
        from_step: 0,
    }];
    let f = finding(&c);
    assert_eq!(
        (f.step, f.kind, f.phase),
        (0, FindingKind::Nan, Phase::Data)
    );
    assert_eq!(f.stats.unwrap().nan, 1);
}

#[test]
fn labels_out_of_range_are_caught_as_data_faults() {
    let mut c = example("cnn");
    c.data.pathologies = vec![Pathology::LabelOutOfRange {
        fraction: 0.1,
        offset: 1,
        from_step: 2,
    }];
    let f = finding(&c);
    assert_eq!(
        (f.step, f.kind, f.stage.as_str()),
        (
            2,
            FindingKind::InvalidLabel,
            "data.pathologies[0].label_out_of_range"
        )
    );
}

fn vector_case(name: &str) -> Case {
    let mut c = example("cnn");
    c.model = ModelSpec::Custom(CustomSpec {
        name: name.into(),
        input: InputSpec::Vector { features: 8 },
        outputs: 4,
        init: InitSpec::default(),
        per_token: false,
        frozen: Vec::new(),
        knobs: Default::default(),
        init_overrides: Default::default(),
    });
    c
}

#[test]
fn mixed_precision_with_dynamic_scaling_skips_overflows_instead_of_failing() {
    let mut c = example("cnn");
    c.steps = 8;
    c.precision = Precision::Mixed {
        compute: HalfType::F16,
        // A scale of 2^40 overflows f16 gradients: the scaler must back off.
        loss_scaling: LossScaling::Dynamic {
            init: 1.1e12,
            growth_interval: 1000,
            floor: 1.0,
        },
    };
    let t = stable_trace(&c);
    assert!(t.skipped_steps > 0, "{t:?}");
    assert!(t.loss_scale.unwrap() < 1.1e12);
}

#[test]
fn a_collapsing_loss_scale_is_a_finding() {
    // Inputs of ~3e3 keep the f16 forward finite; unscaled gradient norms are
    // ~2e4, so scaled by 1024 or more some f16 gradient entries overflow.
    let mut c = raw_cnn(3e3);
    c.steps = 10;
    c.precision = Precision::Mixed {
        compute: HalfType::F16,
        loss_scaling: LossScaling::Dynamic {
            init: 65536.0,
            growth_interval: 1000,
            floor: 1024.0,
        },
    };
    let f = finding(&c);
    // 65536 → 32768 → ... → 1024 (six skips), then 512 < floor fails at step 6.
    assert_eq!(
        (f.step, f.kind, f.phase),
        (6, FindingKind::ScaleCollapse, Phase::Backward),
        "{f:?}"
    );
    assert_eq!(f.trace.skipped_steps, 6);
}

#[test]
fn the_probe_off_still_sees_a_non_finite_loss() {
    let mut c = example("rnn");
    c.data.pathologies = vec![Pathology::Nan {
        fraction: 0.01,
        from_step: 0,
    }];
    let opts = RunOptions {
        probe: false,
        ..RunOptions::default()
    };
    let out = crate::training::run_builtin(&c, &opts).unwrap();
    let f = out.finding().expect("unstable");
    assert_eq!(f.phase, Phase::Forward);
}

#[test]
fn invalid_cases_are_rejected_not_errors() {
    let mut c = example("transformer");
    let ModelSpec::Transformer(t) = &mut c.model else {
        unreachable!()
    };
    t.heads = 3;
    match run(&c).unwrap() {
        Outcome::Rejected { reason } => assert!(reason.contains("model.heads"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// A user model with a parameter that never reaches the loss.
struct Detached {
    used: candle_nn::Linear,
}

impl Model for Detached {
    fn forward(&self, input: &Tensor, _tr: &mut Tracer) -> candle_core::Result<Tensor> {
        candle_core::Module::forward(&self.used, &input.flatten_from(1)?)
    }
}

#[test]
fn a_parameter_without_gradient_is_a_finding_naming_it_unless_declared_frozen() {
    let mut c = example("cnn");
    let mut spec = CustomSpec {
        name: "mine".into(),
        input: InputSpec::Image {
            channels: 3,
            height: 16,
            width: 16,
        },
        outputs: 4,
        init: InitSpec::default(),
        per_token: false,
        frozen: Vec::new(),
        knobs: Default::default(),
        init_overrides: Default::default(),
    };
    c.model = ModelSpec::Custom(spec.clone());
    let factory = |vb: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let _unused = vb
            .pp("ghost")
            .get_with_hints(3, "weight", candle_nn::Init::Const(1.0))?;
        Ok(Box::new(Detached {
            used: candle_nn::linear(768, 4, vb.pp("fc"))?,
        }))
    };
    let outcome = run_model(&c, &factory, &RunOptions::default()).unwrap();
    let f = outcome.finding().expect("a no_gradient finding");
    assert_eq!(
        (f.kind, f.phase, f.step),
        (FindingKind::NoGradient, Phase::Backward, 0)
    );
    assert_eq!(f.stage, "param.ghost.weight");
    let coverage = f.coverage.as_ref().expect("the coverage");
    assert_eq!((coverage.frozen_tensors, coverage.tensors), (1, 3));
    assert_eq!(coverage.frozen_parameters, 3);
    assert_eq!(coverage.frozen_names(), ["ghost.weight"]);
    assert!(
        f.detail.contains("1 of 3 trainable tensors"),
        "{}",
        f.detail
    );
    // Declared frozen, it is left alone and the run trains the rest.
    spec.frozen = vec!["ghost".into()];
    c.model = ModelSpec::Custom(spec);
    let outcome = run_model(&c, &factory, &RunOptions::default()).unwrap();
    assert_eq!(outcome.verdict(), "stable", "{outcome:?}");
}

#[test]
fn users_candle_nn_modules_run_through_the_same_machinery() {
    let mut c = vector_case("mlp");
    c.optimizer.set_lr(1e-2);
    let factory = |vb: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let l1 = candle_nn::linear(8, 16, vb.pp("l1"))?;
        let l2 = candle_nn::linear(16, 4, vb.pp("l2"))?;
        let seq = candle_nn::seq()
            .add(l1)
            .add(candle_nn::Activation::Relu)
            .add(l2);
        Ok(Box::new(ModuleModel(seq)))
    };
    let out = run_model(&c, &factory, &RunOptions::default()).unwrap();
    let t = out.trace().unwrap();
    assert_eq!(out.verdict(), "stable");
    assert!(
        t.losses.last().unwrap() < &(0.6 * t.losses[0]),
        "{:?}",
        t.losses
    );
    // Reproducible: seeded init, not candle's RNG.
    let again = run_model(&c, &factory, &RunOptions::default()).unwrap();
    assert_eq!(out, again);
}

#[test]
fn built_models_have_the_parameter_count_the_spec_predicts() {
    for family in FAMILIES {
        let c = example(family);
        let factory = BuiltinFactory::new(&c.model).unwrap();
        let s = Session::new(&c, &factory, &RunOptions::default()).unwrap();
        assert_eq!(s.params().count(), c.model.param_count(), "{family}");
    }
}

#[test]
fn the_accelerator_probe_reports_a_failed_update_at_its_own_step() {
    // Adam with eps 0: a parameter whose gradient is 0 gets 0/0 at step 0.
    // The accelerator probe sees it at step 1's copy (or at finish) and must
    // still name step 0 and the same producer as the in-place probe.
    let mut case = example("transformer");
    if let OptimizerSpec::Adam { eps, .. } = &mut case.optimizer {
        *eps = 0.0;
    }
    // Embedding rows of tokens no batch uses get a zero gradient.
    if let ModelSpec::Transformer(t) = &mut case.model {
        t.input = TokenOrContinuous::Tokens { vocab: 1024 };
    }
    case.steps = 6;
    let cpu = finding(&case);
    assert_eq!(cpu.phase, Phase::Update, "{}", cpu.detail);
    let accel = RunOptions {
        accelerator_probe: true,
        ..RunOptions::default()
    };
    for steps in [6, cpu.step + 1] {
        case.steps = steps;
        let f = crate::training::run_builtin(&case, &accel).unwrap();
        let f = f.finding().expect("unstable");
        assert_eq!(
            (f.step, &f.stage, &f.detail, &f.signature),
            (cpu.step, &cpu.stage, &cpu.detail, &cpu.signature)
        );
        assert_eq!(f.trace.losses, cpu.trace.losses);
        assert_eq!(f.trace.lrs, cpu.trace.lrs);
    }
}

/// An untraced and a traced forward pass of the same batch, after 3 steps
/// (so that the biases, initialized to 0, are not), with the traced run's
/// stage names and both runs' parameter gradients.
struct Twin {
    plain: Forward,
    traced: Forward,
    stages: Vec<String>,
    grads: [Vec<Tensor>; 2],
}

fn twin(c: &Case) -> Twin {
    let factory = BuiltinFactory::new(&c.model).unwrap();
    let mut s = Session::new(c, &factory, &RunOptions::default()).unwrap();
    for step in 0..3 {
        assert!(s.step(step).unwrap().is_none());
    }
    let batch = s.batch_unchecked(3).unwrap();
    let plain = s.forward_loss(&batch, &mut Tracer::off()).unwrap();
    let mut tracer = Tracer::on();
    let traced = s.forward_loss(&batch, &mut tracer).unwrap();
    let vars = s.vars().1;
    let grads = |f: &Forward| -> Vec<Tensor> {
        let g = f.loss.backward().unwrap();
        vars.iter()
            .map(|v| g.get(v.as_tensor()).unwrap().clone())
            .collect()
    };
    let stages = tracer.records().iter().map(|r| r.name.clone()).collect();
    Twin {
        grads: [grads(&plain), grads(&traced)],
        stages,
        plain,
        traced,
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    let v = t.flatten_all().unwrap().to_dtype(DType::F64).unwrap();
    v.to_vec1::<f64>().unwrap()
}

/// Every value of `a` and `b` has the same bits.
fn assert_same_bits(what: &str, a: &Tensor, b: &Tensor) {
    let (a, b) = (values(a), values(b));
    let differ = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(differ, 0, "{what}: {differ} of {} values differ", a.len());
}

/// Every RNN cell runs as one whole-layer op untraced and as per-step ops
/// when traced (to record each step's gates and state); a traced re-run
/// must see the forward bits of the run it localizes.
#[test]
fn the_layer_ops_and_the_traced_per_step_ops_give_the_same_forward_bits() {
    for (cell, size, layers, precision) in [
        (CellKind::Lstm, Size::Default, 1, Precision::F32),
        (CellKind::Lstm, Size::Large, 1, Precision::F32),
        (CellKind::Lstm, Size::Default, 2, Precision::F32),
        (CellKind::Lstm, Size::Default, 2, Precision::F64),
        (CellKind::Gru, Size::Default, 1, Precision::F32),
        (CellKind::Gru, Size::Large, 2, Precision::F32),
        (CellKind::Gru, Size::Default, 2, Precision::F64),
        (CellKind::Rnn, Size::Default, 1, Precision::F32),
        (CellKind::Rnn, Size::Large, 2, Precision::F32),
        (CellKind::Rnn, Size::Default, 2, Precision::F64),
    ] {
        let mut c = Case::example_sized("rnn", size).unwrap();
        let ModelSpec::Rnn(r) = &mut c.model else {
            unreachable!()
        };
        r.cell = cell;
        r.layers = layers;
        c.precision = precision.clone();
        let t = twin(&c);
        let steps = c.model.input().dims()[0];
        let gates = t.stages.iter().filter(|n| n.ends_with(".gates")).count();
        assert_eq!(gates, layers * steps, "every step's gates are recorded");
        let what = format!("{cell:?}, {size:?}, {layers} layers, {precision:?}");
        assert_same_bits(&what, &t.plain.output, &t.traced.output);
        assert_same_bits(&what, &t.plain.loss, &t.traced.loss);
    }
}

/// A CNN block's activation and max pooling run as one op untraced and as
/// two when traced (to record both); values and gradients agree exactly.
#[test]
fn fused_activation_pooling_and_the_traced_two_ops_agree_exactly() {
    for (size, activation, precision) in [
        (Size::Large, Activation::Relu, Precision::F32),
        (Size::Default, Activation::Relu, Precision::F32),
        (Size::Default, Activation::Gelu, Precision::F64),
    ] {
        let mut c = Case::example_sized("cnn", size).unwrap();
        let ModelSpec::Cnn(m) = &mut c.model else {
            unreachable!()
        };
        for b in &mut m.blocks {
            b.activation = activation;
            b.pool = Pool::Max;
        }
        c.precision = precision.clone();
        let t = twin(&c);
        assert!(t.stages.iter().any(|n| n.ends_with(".act")));
        let what = format!("{size:?}, {activation:?}, {precision:?}");
        assert_same_bits(&what, &t.plain.output, &t.traced.output);
        assert_same_bits(&what, &t.plain.loss, &t.traced.loss);
        for (a, b) in t.grads[0].iter().zip(&t.grads[1]) {
            // == rather than bits: the tracer's extra nodes may turn a -0
            // gradient into +0.
            assert_eq!(values(a), values(b), "{what}: gradients differ");
        }
    }
}

/// The generator's batch of step 0 at every step, its dense targets set to
/// the step's scripted value: with an output of about 0, the MSE loss of
/// step `s` is about `script[s]²`.
struct Scripted {
    generator: crate::data::Generator,
    script: Vec<f32>,
}

impl crate::data::DataSource for Scripted {
    fn batch(&self, step: usize, batch_size: usize) -> Result<crate::data::HostBatch> {
        let mut b = self.generator.batch(0, batch_size);
        b.targets.fill(self.script[step]);
        Ok(b)
    }
}

/// A head whose output is about 0 (1e-6 × a linear layer).
struct Quiet(candle_nn::Linear);

impl Model for Quiet {
    fn forward(&self, input: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
        candle_core::Module::forward(&self.0, input)? * 1e-6
    }
}

#[test]
fn a_divergence_judged_after_its_look_ahead_is_a_finding_at_the_step_that_crossed() {
    let mut c = vector_case("quiet");
    c.loss = LossSpec::Mse {
        root: false,
        eps: 0.0,
    };
    c.optimizer = OptimizerSpec::Sgd {
        lr: 1e-9,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    c.steps = 200;
    let factory = |vb: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(Quiet(candle_nn::linear(8, 4, vb.pp("fc"))?)))
    };
    // A loss of 1 for ten steps, then a plateau at 6: across the 4x line,
    // below the 16x one, and never back.
    let script: Vec<f32> = (0..200)
        .map(|s| if s < 10 { 1.0 } else { 6f32.sqrt() })
        .collect();
    let source = Scripted {
        generator: crate::data::Generator::new(&c),
        script,
    };
    let opts = RunOptions::default();
    let mut session = Session::with_source(&c, &factory, &opts, Box::new(source)).unwrap();
    let mut tracker = DivergenceTracker::new(c.divergence_factor);
    let (mut crossed, mut found) = (None, None);
    for step in 0..c.steps {
        if let Some(f) = session.step(step).unwrap() {
            found = Some((step, f));
            break;
        }
        tracker.push(*session.trace().losses.last().unwrap());
        if tracker.crossed_now() {
            crossed = Some(step);
        }
    }
    let crossed = crossed.expect("the plateau crosses the line");
    let (judged_at, f) = found.expect("judged");
    assert_eq!(judged_at, crossed + crate::probe::LOOKAHEAD, "{f:?}");
    assert_eq!((f.kind, f.step), (FindingKind::Divergence, crossed));
    assert!(
        f.detail.contains("had not recovered 50 steps later"),
        "{}",
        f.detail
    );
    assert_eq!(
        f.trace.losses.len(),
        crossed + 1,
        "the history ends with its step"
    );
    assert!(
        session.failed_before().is_some(),
        "the state before the crossing is kept"
    );
}

/// sqrt(relu(h)): a finite loss whose backward pass is infinite where h ≤ 0.
struct SqrtRelu {
    fc: candle_nn::Linear,
    head: candle_nn::Linear,
}

impl Model for SqrtRelu {
    fn forward(&self, input: &Tensor, _tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = candle_core::Module::forward(&self.fc, input)?;
        candle_core::Module::forward(&self.head, &h.relu()?.sqrt()?)
    }
}

/// The gradient check that rides on the optimizer's fused pass (f32, the
/// probe on, no clipping) fails the step at the backward phase, naming
/// the parameter, before anything is set: the parameters and the
/// optimizer's state are what they were. (Localization would re-derive
/// the phase in a traced re-run; this is the untraced step itself.)
#[test]
fn a_non_finite_gradient_in_the_update_pass_fails_before_anything_is_set() {
    let mut c = vector_case("sqrt_relu");
    c.precision = Precision::F32;
    c.clip = ClipSpec::None;
    let factory = |vb: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(SqrtRelu {
            fc: candle_nn::linear(8, 16, vb.pp("fc"))?,
            head: candle_nn::linear(16, 4, vb.pp("head"))?,
        }))
    };
    let mut session = Session::new(&c, &factory, &RunOptions::default()).unwrap();
    let lr = c.optimizer.lr();
    assert!(session.grads_checked_in_update(1.0, false, Readback::InPlace));
    let values = |s: &Session| -> Vec<Vec<f32>> {
        s.vars
            .iter()
            .map(|v| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .collect()
    };
    let before = values(&session);
    let failed = session
        .step_inner(0, lr, &mut Tracer::off(), false)
        .unwrap()
        .expect("an infinite slope at 0 fails the step")
        .into_failure();
    assert_eq!(failed.phase, Phase::Backward, "{}", failed.detail);
    assert!(failed.stage.starts_with("grad.fc."), "{}", failed.stage);
    let after = values(&session);
    assert_eq!(before, after, "no parameter was set");
    assert_eq!(
        session.optimizer.state_tensors().count(),
        0,
        "no state advanced"
    );
    assert!(session.trace.grad_norms.is_empty());
}
