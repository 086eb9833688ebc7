//! The guard in a user's own candle loop: one planted fault per phase, each
//! stopping at its step with its producer named; the scene replays bit for
//! bit; a healthy loop is untouched; misuse gets a clear error.

use crate::support::*;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{linear, Linear, VarBuilder, VarMap};
use nanhunt::guard::{Batch, Guard, GuardError, GuardOptimizer, GuardOptions};
use nanhunt::rng::Rng;
use nanhunt::spec::OptimizerSpec;
use nanhunt::{FindingKind, Phase, Warning};

/// A user's model: an encoder with a nested block, and a head.
struct Net {
    l1: Linear,
    l2: Linear,
    gate: candle_core::Tensor,
}

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// sqrt of a negative input inside `encoder.inner` (finite data).
    Forward,
    /// log(softmax) written naively, on huge logits: the loss is -log 0.
    Loss,
    /// sqrt at 0 after a relu: a finite forward, an infinite gradient.
    Backward,
    /// A softmax without a backward pass between the layers.
    NoBackward,
    /// Two overflowing sums subtracted in the loss: inf − inf, a NaN
    /// with its sign bit set on x86.
    InfMinusInf,
}

fn net(varmap: &VarMap) -> Net {
    let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
    Net {
        l1: linear(8, 16, vb.pp("l1")).unwrap(),
        l2: linear(16, 4, vb.pp("l2")).unwrap(),
        gate: vb
            .get_with_hints(4, "gate", candle_nn::Init::Const(0.5))
            .unwrap(),
    }
}

impl Net {
    fn encoder(&self, x: &Tensor, fault: Fault) -> candle_core::Result<Tensor> {
        let x = if fault == Fault::Forward {
            nanhunt::trace("encoder.inner.sqrt", x.sqrt()?)?
        } else {
            x.clone()
        };
        let h = nanhunt::trace("encoder.l1", self.l1.forward(&x)?)?;
        let h = nanhunt::trace("encoder.relu", h.relu()?)?;
        match fault {
            Fault::Backward => nanhunt::trace("encoder.sqrt", h.sqrt()?),
            Fault::NoBackward => candle_nn::ops::softmax_last_dim(&h),
            _ => Ok(h),
        }
    }

    fn loss(&self, b: &Batch, fault: Fault) -> candle_core::Result<Tensor> {
        let (x, y) = (b.get("x")?, b.get("y")?);
        let h = self.encoder(x, fault)?;
        let logits = nanhunt::trace("head", self.l2.forward(&h)?)?;
        // The gate's gradient is exactly zero: Adam with eps 0 divides 0 by 0.
        let logits = logits.broadcast_add(&(self.gate.broadcast_mul(&self.gate.zeros_like()?))?)?;
        if fault == Fault::InfMinusInf {
            // exp of at least 100 passes f32's range whatever the weights.
            let big = ((logits.abs()? * 1e3)? + 100.0)?.exp()?.sum_all()?;
            return big.clone() - big;
        }
        if fault == Fault::Loss {
            let p = candle_nn::ops::softmax(&(logits * 1e4)?, 1)?;
            let picked = (p * y)?.sum(1)?;
            return picked.log()?.neg()?.mean_all();
        }
        let logp = candle_nn::ops::log_softmax(&logits, 1)?;
        (logp * y)?.sum(1)?.neg()?.mean_all()
    }
}

/// The batch of a step: inputs in [0, 1), one-hot targets.
fn batch(step: usize) -> Batch {
    let mut rng = Rng::keyed(7, "guard.test", step as u64);
    let x: Vec<f32> = (0..32 * 8).map(|_| rng.uniform() as f32).collect();
    let y: Vec<f32> = (0..32)
        .flat_map(|r| (0..4).map(move |c| if c == r % 4 { 1.0 } else { 0.0 }))
        .collect();
    Batch::new([
        ("x", Tensor::from_vec(x, (32, 8), &Device::Cpu).unwrap()),
        ("y", Tensor::from_vec(y, (32, 4), &Device::Cpu).unwrap()),
    ])
}

/// The batch with input value `at` set to `v` (finite data or not).
fn with_value(b: &Batch, at: usize, v: f32) -> Batch {
    let x = b.get("x").unwrap();
    let mut values = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    values[at] = v;
    Batch::new([
        (
            "x",
            Tensor::from_vec(values, x.dims(), &Device::Cpu).unwrap(),
        ),
        ("y", b.get("y").unwrap().clone()),
    ])
}

fn with_nan(b: &Batch) -> Batch {
    with_value(b, 13, f32::NAN)
}

fn with_negative(b: &Batch) -> Batch {
    with_value(b, 5, -4.0)
}

fn adam(eps: f64) -> OptimizerSpec {
    OptimizerSpec::Adam {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps,
        weight_decay: 0.0,
    }
}

/// Runs 10 guarded steps; at `at` the batch and the model take the fault.
/// Returns the error of the first failure (or the losses).
fn guarded(
    at: usize,
    fault: Fault,
    data_fault: Option<fn(&Batch) -> Batch>,
    spec: OptimizerSpec,
    dump: Option<std::path::PathBuf>,
) -> Result<Vec<f64>, GuardError> {
    let varmap = VarMap::new();
    let model = net(&varmap);
    let mut opts = GuardOptions::default().named("user_net");
    opts.dump = dump;
    let mut guard = Guard::new(&varmap, opts).unwrap();
    let mut opt = guard.optimizer(spec).unwrap();
    let mut losses = Vec::new();
    for step in 0..10 {
        let mut b = batch(step);
        let f = if step == at { fault } else { Fault::None };
        if step == at {
            if let Some(d) = data_fault {
                b = d(&b);
            }
        }
        losses.push(guard.step(step, &b, &mut opt, |b| model.loss(b, f))?);
    }
    Ok(losses)
}

fn finding_of(r: Result<Vec<f64>, GuardError>) -> nanhunt::Finding {
    match r {
        Err(GuardError::Unstable { finding, .. }) => *finding,
        other => panic!("expected a finding, got {other:?}"),
    }
}

#[test]
fn each_planted_fault_stops_at_its_step_with_its_producer() {
    let f = finding_of(guarded(3, Fault::None, Some(with_nan), adam(1e-8), None));
    assert_eq!(
        (f.step, f.kind, f.phase, f.stage.as_str()),
        (3, FindingKind::Nan, Phase::Data, "batch.x")
    );

    let f = finding_of(guarded(
        4,
        Fault::Forward,
        Some(with_negative),
        adam(1e-8),
        None,
    ));
    assert_eq!(
        (f.step, f.phase, f.stage.as_str()),
        (4, Phase::Forward, "encoder.inner.sqrt"),
        "{}",
        f.detail
    );
    // The guard's findings explain the stage too: the first record reads
    // the loss closure's inputs, unknown to the guard, so the op's name tells.
    let e = f.explanation.as_ref().expect("explained");
    assert_eq!(
        e.pattern,
        nanhunt::explain::Pattern::NegativeDomain,
        "{}",
        e.sentence
    );

    let f = finding_of(guarded(2, Fault::Loss, None, adam(1e-8), None));
    assert_eq!(
        (f.step, f.phase, f.stage.as_str()),
        (2, Phase::Loss, "loss"),
        "{}",
        f.detail
    );

    let f = finding_of(guarded(5, Fault::Backward, None, adam(1e-8), None));
    assert_eq!(
        (f.step, f.phase, f.stage.as_str()),
        (5, Phase::Backward, "encoder.sqrt"),
        "{}",
        f.detail
    );
    assert!(f.detail.contains("`encoder.relu`"), "{}", f.detail);
    let e = f.explanation.as_ref().expect("explained");
    assert_eq!(
        (e.pattern, e.input.as_deref()),
        (
            nanhunt::explain::Pattern::InfiniteSlopeAtZero,
            Some("encoder.relu")
        ),
        "{}",
        e.sentence
    );

    let f = finding_of(guarded(99, Fault::None, None, adam(0.0), None));
    assert_eq!(
        (f.step, f.phase, f.stage.as_str()),
        (0, Phase::Update, "param.gate"),
        "{}",
        f.detail
    );

    let f = finding_of(guarded(6, Fault::NoBackward, None, adam(1e-8), None));
    assert_eq!(
        (f.step, f.kind, f.phase),
        (6, FindingKind::NoGradient, Phase::Backward)
    );
    // The traced re-run names where the flow stops: the fused softmax
    // between the two recorded stages.
    assert_eq!(f.stage, "encoder.relu");
    assert!(
        f.detail.contains("2 of 5")
            && f.detail.contains("l1 (bias, weight)")
            && f.detail
                .contains("between stages `encoder.relu` and `head`"),
        "{}",
        f.detail
    );
    assert_eq!(f.signature.family, "user_net");
}

#[test]
fn an_optimizer_over_the_variables_in_another_order_gets_the_same_findings() {
    // The guard reads the gradients' scans from nanhunt's optimizer only
    // where it updates the guard's variables in the guard's order; built
    // by the user over them reversed, it is checked by the guard's own scan.
    // `jump`: at step 3 the same loss with a gradient 1e4x larger, which
    // the guard warns about, naming the variable whose gradient led.
    // `eps` 0: Adam's first update divides 0 by 0 where a gradient is 0.
    let run = |reversed: bool, fault: Fault, data_fault: Option<fn(&Batch) -> Batch>, jump, eps| {
        let varmap = VarMap::new();
        let model = net(&varmap);
        let mut guard = Guard::new(&varmap, GuardOptions::default().named("user_net")).unwrap();
        // The same start in both runs (candle-nn draws its own init).
        let mut rng = Rng::new(7);
        for v in guard.vars() {
            let values: Vec<f32> = (0..v.elem_count())
                .map(|_| 0.3 * rng.normal() as f32)
                .collect();
            v.set(&Tensor::from_vec(values, v.shape(), &Device::Cpu).unwrap())
                .unwrap();
        }
        let mut vars = guard.vars().to_vec();
        if reversed {
            vars.reverse();
        }
        let mut opt =
            <nanhunt::guard::NanhuntOptimizer as candle_nn::Optimizer>::new(vars, adam(eps))
                .unwrap();
        assert_eq!(opt.updates_exactly(guard.vars()), !reversed);
        let mut last = None;
        for step in 0..6 {
            let (mut b, f) = (batch(step), if step == 5 { fault } else { Fault::None });
            if let (5, Some(d)) = (step, data_fault) {
                b = d(&b);
            }
            let r = guard.step(step, &b, &mut opt, |b| {
                let loss = model.loss(b, f)?;
                if !(jump && step == 3) {
                    return Ok(loss);
                }
                (&loss * 1e4)? - (&loss * (1e4 - 1.0))?.detach()
            });
            match r {
                Ok(_) => {}
                Err(GuardError::Unstable { finding, .. }) => {
                    last = Some((finding.step, finding.phase, finding.stage, finding.detail));
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        let norms: Vec<u64> = guard
            .history()
            .grad_norms
            .iter()
            .map(|x| x.to_bits())
            .collect();
        (last, norms, guard.warnings().to_vec())
    };
    for (fault, data, jump, eps) in [
        (Fault::Backward, None, false, 1e-8),
        (
            Fault::None,
            Some(with_nan as fn(&Batch) -> Batch),
            false,
            1e-8,
        ),
        (Fault::None, None, true, 1e-8),
        (Fault::None, None, false, 0.0),
    ] {
        let in_order = run(false, fault, data, jump, eps);
        assert!(in_order.0.is_some() || !in_order.2.is_empty());
        assert_eq!(in_order, run(true, fault, data, jump, eps));
    }
}

#[test]
fn a_gradient_that_jumps_by_orders_of_magnitude_is_warned_about() {
    let varmap = VarMap::new();
    let model = net(&varmap);
    let mut guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
    let mut opt = guard.optimizer(adam(1e-8)).unwrap();
    for step in 0..10 {
        let b = batch(step);
        guard
            .step(step, &b, &mut opt, |b| {
                let loss = model.loss(b, Fault::None)?;
                if step != 6 {
                    return Ok(loss);
                }
                // The same value, a gradient 1e4x larger (Adam keeps the step bounded).
                (&loss * 1e4)? - (&loss * (1e4 - 1.0))?.detach()
            })
            .unwrap();
    }
    let warned: Vec<&Warning> = guard
        .warnings()
        .iter()
        .filter(|w| matches!(w, Warning::Jump(_)))
        .collect();
    assert_eq!(warned.len(), 1, "{:?}", guard.warnings());
    assert_eq!(warned[0].step(), 6);
    let text = warned[0].to_string();
    assert!(
        text.starts_with("step 6:") && text.contains("finite explosion"),
        "{text}"
    );
}

#[test]
fn a_healthy_loop_is_untouched_by_its_guard() {
    // candle's init is random: both runs start from one snapshot of it.
    let varmap = VarMap::new();
    let model = net(&varmap);
    let snapshot: Vec<(String, Tensor)> = {
        let data = varmap.data().lock().unwrap();
        data.iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().copy().unwrap()))
            .collect()
    };
    let run = |guard_it: bool| -> Vec<u64> {
        for (n, t) in &snapshot {
            varmap.data().lock().unwrap()[n].set(t).unwrap();
        }
        let mut guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
        let mut opt = guard.optimizer(adam(1e-8)).unwrap();
        (0..10)
            .map(|step| {
                let b = batch(step);
                let l = if guard_it {
                    guard
                        .step(step, &b, &mut opt, |b| model.loss(b, Fault::None))
                        .unwrap()
                } else {
                    let loss = model.loss(&b, Fault::None).unwrap();
                    opt.apply(&loss.backward().unwrap()).unwrap();
                    loss.to_dtype(DType::F64)
                        .unwrap()
                        .to_scalar::<f64>()
                        .unwrap()
                };
                l.to_bits()
            })
            .collect()
    };
    assert_eq!(
        run(true),
        run(false),
        "the same bits with and without the guard"
    );
}

/// A loss that is inf − inf: the scene keeps the NaN as the step made it
/// (its sign and payload), and the replay, which compares values, calls
/// it reproduced and bit-identical.
#[test]
fn a_nan_loss_scene_replays_reproduced_and_bit_identical() {
    let dir = scratch("guard-nan-loss").join("scene");
    let f = finding_of(guarded(
        2,
        Fault::InfMinusInf,
        None,
        adam(1e-3),
        Some(dir.clone()),
    ));
    assert_eq!((f.step, f.phase), (2, Phase::Loss), "{}", f.stage);
    let text = std::fs::read_to_string(dir.join("scene.json")).unwrap();
    let scene: serde_json::Value = serde_json::from_str(&text).unwrap();
    let last = scene["recent_losses"].as_array().unwrap().last().cloned();
    let loss = f.trace.losses.last().copied().unwrap();
    assert!(loss.is_nan());
    let written = match loss.to_bits() == f64::NAN.to_bits() {
        true => "NaN".to_string(),
        false => format!("NaN:{:016x}", loss.to_bits()),
    };
    assert_eq!(last, Some(serde_json::Value::String(written)));
    let varmap = VarMap::new();
    let model = net(&varmap);
    let r = nanhunt::guard::replay(&dir, &varmap, |b| model.loss(b, Fault::InfMinusInf)).unwrap();
    assert!(r.reproduced(), "{}", r.message);
    assert_eq!(r.bit_identical, Some(true), "{}", r.message);
}

#[test]
fn the_scene_is_written_restored_and_replays_bit_for_bit() {
    let dir_root = scratch("guard-scene");
    let dir = dir_root.join("scene");
    let err = guarded(99, Fault::None, None, adam(0.0), Some(dir.clone())).unwrap_err();
    assert!(err.to_string().contains("scene in"), "{err}");
    let scene: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("scene.json")).unwrap()).unwrap();
    assert_eq!(scene["optimizer"]["kind"], "saved");
    assert_eq!(scene["finding"]["stage"], "param.gate");
    // Python reads the tensors.
    let script = format!(
        "from safetensors.numpy import load_file; t = load_file({:?}); print(sorted(t))",
        dir.join("scene.safetensors").to_str().unwrap()
    );
    let out = python_with_safetensors()
        .args(["-c", &script])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&out.stdout);
    assert!(
        names.contains("param/gate") && names.contains("batch/x"),
        "{names}"
    );

    // A fresh model of the same shape replays the scene.
    let varmap = VarMap::new();
    let model = net(&varmap);
    let r = nanhunt::guard::replay(&dir, &varmap, |b| model.loss(b, Fault::None)).unwrap();
    assert!(r.reproduced(), "{}", r.message);
    assert_eq!(r.bit_identical, Some(true));

    // `nanhunt inspect` prints the scene.
    let out = nanhunt(&["inspect", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("param.gate") && text.contains("recent losses"),
        "{text}"
    );
}

#[test]
fn after_a_failure_the_state_from_before_the_step_is_back() {
    let varmap = VarMap::new();
    let model = net(&varmap);
    let mut guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
    let mut opt = guard.optimizer(adam(1e-8)).unwrap();
    guard
        .step(0, &batch(0), &mut opt, |b| model.loss(b, Fault::None))
        .unwrap();
    let before: Vec<Vec<f32>> = guard
        .vars()
        .iter()
        .map(|v| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    let err = guard.step(1, &batch(1), &mut opt, |b| model.loss(b, Fault::Loss));
    assert!(err.is_err());
    let after: Vec<Vec<f32>> = guard
        .vars()
        .iter()
        .map(|v| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    assert_eq!(before, after);
}

#[test]
fn a_failed_step_leaves_the_optimizer_as_it_was() {
    // Two copies of one net; the first takes a failing step between two
    // good ones. The guard reads a preparing optimizer's state only on a
    // failure: the next good step must be the same bits in both.
    let (first, second) = (VarMap::new(), VarMap::new());
    let (a, b) = (net(&first), net(&second));
    for (name, var) in first.data().lock().unwrap().iter() {
        second.data().lock().unwrap()[name]
            .set(var.as_tensor())
            .unwrap();
    }
    let mut ga = Guard::new(&first, GuardOptions::default()).unwrap();
    let mut gb = Guard::new(&second, GuardOptions::default()).unwrap();
    let (mut oa, mut ob) = (
        ga.optimizer(adam(1e-8)).unwrap(),
        gb.optimizer(adam(1e-8)).unwrap(),
    );
    ga.step(0, &batch(0), &mut oa, |x| a.loss(x, Fault::None))
        .unwrap();
    gb.step(0, &batch(0), &mut ob, |x| b.loss(x, Fault::None))
        .unwrap();
    assert!(ga
        .step(1, &batch(1), &mut oa, |x| a.loss(x, Fault::Loss))
        .is_err());
    ga.step(1, &batch(1), &mut oa, |x| a.loss(x, Fault::None))
        .unwrap();
    gb.step(1, &batch(1), &mut ob, |x| b.loss(x, Fault::None))
        .unwrap();
    let bits = |vm: &VarMap| {
        let data = vm.data().lock().unwrap();
        let mut named: Vec<(String, Vec<u32>)> = data
            .iter()
            .map(|(n, v)| {
                let values = v
                    .as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                (n.clone(), values.iter().map(|x| x.to_bits()).collect())
            })
            .collect();
        named.sort();
        named
    };
    assert_eq!(bits(&first), bits(&second));
}

#[test]
fn misuse_gets_a_clear_error() {
    let empty = VarMap::new();
    let e = Guard::new(&empty, GuardOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no trainable variables"), "{e}");
    let taken = scratch("guard-taken");
    let varmap = VarMap::new();
    let model = net(&varmap);
    let e = Guard::new(&varmap, GuardOptions::default().dump_to(&*taken))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("already exists"), "{e}");
    let mut guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
    let mut opt = guard.optimizer(adam(1e-8)).unwrap();
    guard
        .step(0, &batch(0), &mut opt, |b| model.loss(b, Fault::None))
        .unwrap();
    let wide = Batch::new([
        (
            "x",
            Tensor::zeros((32, 9), DType::F32, &Device::Cpu).unwrap(),
        ),
        ("y", batch(1).get("y").unwrap().clone()),
    ]);
    let e = guard
        .step(1, &wide, &mut opt, |b| model.loss(b, Fault::None))
        .unwrap_err();
    assert!(matches!(e, GuardError::Invalid(_)), "{e}");
    assert!(e.to_string().contains("`x` F32 (N, [9])"), "{e}");
    // candle-nn's own optimizer steps, but the scene says its state is private.
    let dir_root = scratch("guard-candle-opt");
    let dir = dir_root.join("scene");
    let varmap = VarMap::new();
    let model = net(&varmap);
    let mut guard = Guard::new(&varmap, GuardOptions::default().dump_to(&dir)).unwrap();
    let mut opt = <candle_nn::AdamW as candle_nn::Optimizer>::new(
        guard.vars().to_vec(),
        candle_nn::ParamsAdamW::default(),
    )
    .unwrap();
    guard
        .step(0, &batch(0), &mut opt, |b| model.loss(b, Fault::None))
        .unwrap();
    let e = guard.step(1, &with_nan(&batch(1)), &mut opt, |b| {
        model.loss(b, Fault::None)
    });
    assert!(e.is_err());
    let scene = std::fs::read_to_string(dir.join("scene.json")).unwrap();
    assert!(
        scene.contains("not_available") && scene.contains("candle_nn::AdamW"),
        "{scene}"
    );
}

/// A user model that names its stages with `nanhunt::trace` only.
struct DeepLog {
    l: Linear,
}

impl nanhunt::models::Model for DeepLog {
    fn forward(
        &self,
        x: &Tensor,
        _tracer: &mut nanhunt::models::Tracer,
    ) -> candle_core::Result<Tensor> {
        let h = nanhunt::trace("encoder.block3.proj", self.l.forward(x)?)?;
        // log of a negative projection: NaN from finite values, three calls deep.
        nanhunt::trace("encoder.block3.log", h.log()?)
    }
}

#[test]
fn run_model_localizes_stages_a_user_traced_from_any_depth() {
    use nanhunt::spec::*;
    let mut case = Case::example("cnn").unwrap();
    case.model = ModelSpec::Custom(CustomSpec::new(
        "deep_log",
        InputSpec::Vector { features: 8 },
        4,
    ));
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn nanhunt::models::Model>> {
        Ok(Box::new(DeepLog {
            l: linear(8, 4, vb.pp("l"))?,
        }))
    };
    let out = nanhunt::run_model(&case, &factory, &nanhunt::RunOptions::default()).unwrap();
    let nanhunt::Outcome::Unstable { finding } = out else {
        panic!("{out:?}")
    };
    assert_eq!(
        (finding.phase, finding.stage.as_str()),
        (Phase::Forward, "encoder.block3.log"),
        "{}",
        finding.detail
    );
    // Read against the record before it, through `nanhunt::trace` as well.
    let e = finding.explanation.as_ref().expect("explained");
    assert_eq!(
        (e.pattern, e.input.as_deref()),
        (
            nanhunt::explain::Pattern::NegativeDomain,
            Some("encoder.block3.proj")
        ),
        "{}",
        e.sentence
    );
}

#[test]
fn half_precision_gradients_near_overflow_are_warned_about() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F16, &Device::Cpu);
    let w = vb
        .get_with_hints(4, "w", candle_nn::Init::Const(1e-3))
        .unwrap();
    let mut guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
    let mut opt = guard
        .optimizer(OptimizerSpec::Sgd {
            lr: 1e-9,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        })
        .unwrap();
    let b = Batch::new([("x", Tensor::ones(4, DType::F16, &Device::Cpu).unwrap())]);
    // d/dw of sum(w * 5000) is 5000: far from f16's 65504 / 8.
    guard
        .step(0, &b, &mut opt, |_| (&w * 5000.0)?.sum_all())
        .unwrap();
    assert!(guard.warnings().is_empty(), "{:?}", guard.warnings());
    guard
        .step(1, &b, &mut opt, |_| (&w * 20000.0)?.sum_all())
        .unwrap();
    assert_eq!(guard.warnings().len(), 1, "{:?}", guard.warnings());
    let Warning::HalfMargin { tensor, dtype, .. } = &guard.warnings()[0] else {
        panic!("{:?}", guard.warnings());
    };
    assert_eq!((tensor.as_str(), dtype.as_str()), ("w", "F16"));
    assert!(guard.warnings()[0].to_string().contains("`w`"));
}

/// A model that traces nothing: sqrt of its input (NaN where the input is
/// negative, carried to the output by tanh), and the naive cross-entropy
/// of the loss fault above.
fn untraced_forward(l1: &Linear, l2: &Linear, b: &Batch) -> candle_core::Result<Tensor> {
    let h = l1.forward(&b.get("x")?.sqrt()?)?.tanh()?;
    l2.forward(&h)
}

fn naive_loss(logits: &Tensor, b: &Batch) -> candle_core::Result<Tensor> {
    let p = candle_nn::ops::softmax(&(logits * 1e4)?, 1)?;
    (p * b.get("y")?)?.sum(1)?.log()?.neg()?.mean_all()
}

#[test]
fn without_traces_the_guard_never_calls_a_forward_nan_a_loss_nan() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let (l1, l2) = (
        linear(8, 16, vb.pp("l1")).unwrap(),
        linear(16, 4, vb.pp("l2")).unwrap(),
    );
    let stop = |negative: bool, split: bool, naive: bool| {
        let mut guard = Guard::new(&varmap, GuardOptions::default().named("plain")).unwrap();
        let mut opt = guard.optimizer(sgd(1e-2)).unwrap();
        let b = if negative {
            with_negative(&batch(0))
        } else {
            batch(0)
        };
        let loss = |logits: &Tensor, b: &Batch| match naive {
            true => naive_loss(logits, b),
            false => candle_nn::loss::cross_entropy(logits, &b.get("y")?.argmax(1)?),
        };
        let r = match split {
            true => {
                guard.step_with_output(0, &b, &mut opt, |b| untraced_forward(&l1, &l2, b), loss)
            }
            false => guard.step(0, &b, &mut opt, |b| {
                loss(&untraced_forward(&l1, &l2, b)?, b)
            }),
        };
        match r {
            Err(GuardError::Unstable { finding, .. }) => *finding,
            other => panic!("expected a finding, got {other:?}"),
        }
    };
    // The forward pass's NaN, told by the split closures: a forward finding.
    let f = stop(true, true, false);
    assert_eq!(
        (f.phase, f.stage.as_str()),
        (Phase::Forward, "output"),
        "{f:?}"
    );
    // The loss's own -log 0 on a finite output: a loss finding.
    let f = stop(false, true, true);
    assert_eq!(f.phase, Phase::Loss, "{f:?}");
    assert!(!f.detail.contains("no stage was traced"), "{}", f.detail);
    // One closure and no traces: the guard says it cannot tell.
    let f = stop(true, false, false);
    assert!(f.detail.contains("Guard::step_with_output"), "{}", f.detail);
}
