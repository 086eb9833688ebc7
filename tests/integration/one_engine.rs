//! One engine, two drivers: the same user model with the same planted bug,
//! run by `run_model` and by the guard in a plain candle loop over the
//! same parameters, batches, optimizer and loss, gives the same finding —
//! the same signature, stage, kind, step and explanation — whoever drove
//! the step.

use crate::code_bugs::{planted_patterns, Planted};
use candle_core::{DType, Device, Tensor};
use nanhunt::data::{HostBatch, HostInput};
use nanhunt::guard::{Batch, Guard, GuardError, GuardOptions, Rebuilt};
use nanhunt::models::{Knobs, Model, ModelFactory, ParamStore, Tracer};
use nanhunt::runner::Session;
use nanhunt::spec::Case;
use nanhunt::{run_model, Finding, Outcome, RunOptions};

/// The case's batch of a step as the guard's named tensors: `x` in the
/// compute dtype, the dense targets `y` in the loss dtype.
fn batch_of(b: &HostBatch, case: &Case) -> Batch {
    let cpu = Device::Cpu;
    let x = match &b.input {
        HostInput::Real { values, dims } => Tensor::from_slice(values, dims.as_slice(), &cpu)
            .unwrap()
            .to_dtype(case.precision.compute_dtype())
            .unwrap(),
        HostInput::Tokens { ids, dims } => Tensor::from_slice(ids, dims.as_slice(), &cpu).unwrap(),
    };
    let y = Tensor::from_slice(&b.targets, (b.rows(), b.classes), &cpu)
        .unwrap()
        .to_dtype(case.precision.loss_dtype())
        .unwrap();
    Batch::new([("x", x), ("y", y)])
}

/// The case's loss of a model's output on a guard's batch, as the runner
/// computes it (in the targets' dtype: the case's loss dtype, or the
/// precision a rebuilt model runs in).
fn case_loss(model: &dyn Model, case: &Case, b: &Batch) -> candle_core::Result<Tensor> {
    let out = model.forward(b.get("x")?, &mut Tracer::current())?;
    let targets = b.get("y")?;
    let logits = match out.rank() {
        3 => out.flatten(0, 1)?,
        _ => out,
    }
    .to_dtype(targets.dtype())?;
    nanhunt::losses::batch_loss(&case.loss, None, &logits, targets, None)
        .map_err(|e| candle_core::Error::Msg(e.to_string()))
}

/// The planted model in a user's own guarded loop: the runner's initial
/// parameters (the same seeded store), its batches, its optimizer and loss.
fn guarded(case: &Case, factory: &dyn ModelFactory) -> Finding {
    guarded_with(case, factory, GuardOptions::default())
}

fn guarded_with(case: &Case, factory: &dyn ModelFactory, opts: GuardOptions) -> Finding {
    let batches = Session::new(case, factory, &RunOptions::default()).unwrap();
    let store = ParamStore::new(
        case.seed,
        case.model.init(),
        case.precision.master_dtype(),
        Device::Cpu,
    );
    let knobs = Knobs::of(&case.model);
    factory
        .build_with(store.creating_builder(), &case.model, &knobs)
        .unwrap();
    let compute = case.precision.compute_dtype();
    let model = factory
        .build_with(store.compute_builder(compute), &case.model, &knobs)
        .unwrap();
    let opts = opts.named(case.family());
    let mut guard = Guard::with_vars(store.trainable(), opts).unwrap();
    let mut opt = guard.optimizer(case.optimizer.clone()).unwrap();
    let loss_of = |b: &Batch| case_loss(&*model, case, b);
    for step in 0..case.steps {
        let b = batches.batch(step).unwrap().unwrap();
        match guard.step(step, &batch_of(&b, case), &mut opt, loss_of) {
            Ok(_) => {}
            Err(GuardError::Unstable { finding, .. }) => return *finding,
            Err(e) => panic!("{}: the guard failed: {e}", case.family()),
        }
    }
    match guard.finish(&opt) {
        Err(GuardError::Unstable { finding, .. }) => *finding,
        other => panic!(
            "{}: the guarded loop found nothing: {other:?}",
            case.family()
        ),
    }
}

#[test]
fn the_runner_and_the_guard_give_the_same_finding_for_every_planted_pattern() {
    let all = planted_patterns();
    assert!(all.len() >= 7, "the planted patterns of code_bugs");
    for Planted {
        case,
        factory,
        stage,
        pattern,
    } in all
    {
        let name = case.family().to_string();
        let ran = match run_model(&case, &*factory, &RunOptions::default()).unwrap() {
            Outcome::Unstable { finding } => *finding,
            other => panic!("{name}: run_model found nothing: {}", other.verdict()),
        };
        let guarded = guarded(&case, &*factory);
        assert_eq!(
            (
                &guarded.signature,
                &guarded.stage,
                guarded.kind,
                guarded.step
            ),
            (&ran.signature, &ran.stage, ran.kind, ran.step),
            "{name}: {} / {}",
            guarded.detail,
            ran.detail
        );
        let (e_run, e_guard) = (ran.explanation.unwrap(), guarded.explanation.unwrap());
        assert_eq!(
            (e_run.stage.as_str(), e_run.pattern),
            (stage, pattern),
            "{name}: {}",
            e_run.sentence
        );
        assert_eq!(e_guard, e_run, "{name}");
        // Both carry the precision check's verdict field (the guard's says
        // why it could not re-run: it has no rebuild here).
        assert!(
            ran.precision.is_some() && guarded.precision.is_some(),
            "{name}"
        );
    }
}

#[test]
fn a_half_precision_overflow_of_the_loss_is_an_overflow_in_both_drivers() {
    // The loss itself overflows f16: 1e3 * sum(w) with w = 100 is 4e5.
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F16, &Device::Cpu);
    let w = vb
        .get_with_hints(4, "w", candle_nn::Init::Const(100.0))
        .unwrap();
    let mut guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
    let mut opt = guard
        .optimizer(nanhunt::spec::OptimizerSpec::Sgd {
            lr: 1e-3,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        })
        .unwrap();
    let b = Batch::new([("x", Tensor::ones(4, DType::F16, &Device::Cpu).unwrap())]);
    let err = guard
        .step(0, &b, &mut opt, |_| (&w * 1e3)?.sum_all())
        .unwrap_err();
    let f = err.finding().unwrap();
    assert_eq!(f.kind, nanhunt::FindingKind::Overflow, "{}", f.detail);
    assert_eq!(f.signature.precision, "f16");
}

#[test]
fn a_finite_explosion_is_the_same_finding_in_the_guard_judged_at_the_loops_end() {
    let case = crate::explosion::exploding_rnn();
    let factory = crate::explosion::rnn_factory;
    let ran = match run_model(&case, &factory, &RunOptions::default()).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("run_model found nothing: {}", other.verdict()),
    };
    let guarded = guarded(&case, &factory);
    assert_eq!(ran.kind, nanhunt::FindingKind::Explosion, "{}", ran.detail);
    assert_eq!(
        (&guarded.signature, &guarded.stage, guarded.step),
        (&ran.signature, &ran.stage, ran.step),
        "{} / {}",
        guarded.detail,
        ran.detail
    );
    assert!(
        guarded.detail.contains("never recovered"),
        "{}",
        guarded.detail
    );
    assert_eq!(
        guarded.trace.losses, ran.trace.losses,
        "the same history up to the jump"
    );
    // Told what chance is, the guard judges the recovery as the runner does.
    let opts = GuardOptions::default().classes(case.model.classes());
    let told = guarded_with(&case, &factory, opts);
    assert_eq!(told.detail, ran.detail);
}

#[test]
fn a_guard_finding_gets_the_runners_precision_check_when_its_model_can_be_rebuilt() {
    let p = planted_patterns()
        .into_iter()
        .find(|p| p.case.family() == "f16_attention")
        .unwrap();
    let ran = match run_model(&p.case, &*p.factory, &RunOptions::default()).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("run_model found nothing: {}", other.verdict()),
    };
    let case = p.case.clone();
    let rebuild = move |dtype: DType| {
        let varmap = candle_nn::VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, dtype, &Device::Cpu);
        let model = crate::code_bugs::unscaled_attention(vb)?;
        let case = case.clone();
        Ok(Rebuilt::new(varmap, move |b: &Batch| {
            case_loss(&*model, &case, b)
        }))
    };
    let opts = GuardOptions::default().rebuild(rebuild);
    let rebuilt = guarded_with(&p.case, &*p.factory, opts);
    let (checked, expected) = (rebuilt.precision.unwrap(), ran.precision.unwrap());
    assert_eq!(
        checked.verdict,
        expected.verdict,
        "{} / {}",
        checked.summary(),
        expected.summary()
    );
    assert_eq!(
        checked.reruns.len(),
        2,
        "f32 and f64: {}",
        checked.summary()
    );
    assert!(
        checked.reruns.iter().all(|r| r.ran),
        "{}",
        checked.summary()
    );
    // The framework mark too: the step with PyTorch's rounding, on the
    // rebuilt model, says what the runner's says.
    let mark = |c: &nanhunt::fidelity::PrecisionCheck| {
        let m = c.framework.clone().expect("a framework mark");
        (m.verdict, m.rule)
    };
    assert_eq!(mark(&checked), mark(&expected), "{:?}", checked.framework);
    // Without a rebuild the guard says why it did not check.
    let plain = guarded(&p.case, &*p.factory).precision.unwrap();
    assert_eq!(plain.verdict, nanhunt::fidelity::Robustness::NotChecked);
    assert!(plain.summary().contains("rebuild"), "{}", plain.summary());
    assert_eq!(
        mark(&plain).0,
        nanhunt::fidelity::FrameworkVerdict::NotJudged,
        "a half-precision loop it cannot rebuild"
    );
}

/// The planted model in a guarded loop over a `VarMap` (candle's own
/// variables, as users have them), writing its scene to `dir`.
fn guarded_scene(case: &Case, factory: &dyn ModelFactory, dir: &std::path::Path) -> Finding {
    guarded_scene_by(case, factory, dir, false)
}

/// [`guarded_scene`], with candle's own SGD (whose state the scene cannot
/// hold) when `private`.
fn guarded_scene_by(
    case: &Case,
    factory: &dyn ModelFactory,
    dir: &std::path::Path,
    private: bool,
) -> Finding {
    let batches = Session::new(case, factory, &RunOptions::default()).unwrap();
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = factory.build(vb).unwrap();
    let opts = GuardOptions::default().named(case.family()).dump_to(dir);
    let mut guard = Guard::new(&varmap, opts).unwrap();
    let mut opt: Box<dyn nanhunt::guard::GuardOptimizer> = match private {
        false => Box::new(guard.optimizer(case.optimizer.clone()).unwrap()),
        true => {
            use candle_nn::Optimizer;
            Box::new(candle_nn::SGD::new(varmap.all_vars(), case.optimizer.lr()).unwrap())
        }
    };
    for step in 0..case.steps {
        let b = batch_of(&batches.batch(step).unwrap().unwrap(), case);
        if let Err(GuardError::Unstable { finding, .. }) =
            guard.step(step, &b, &mut *opt, |b| case_loss(&*model, case, b))
        {
            return *finding;
        }
    }
    panic!("{}: no finding", case.family());
}

#[test]
fn diagnose_takes_a_guards_scene_and_the_users_closure() {
    use nanhunt::diagnose::{diagnose_scene, CauseKind};
    let p = planted_patterns()
        .into_iter()
        .find(|p| p.case.family() == "rownorm")
        .unwrap();
    let dir_root = crate::support::scratch("scene-diagnose");
    let dir = dir_root.join("scene");
    let found = guarded_scene(&p.case, &*p.factory, &dir);
    // A fresh model of the same shape replays the scene, fix by fix.
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = p.factory.build(vb).unwrap();
    let d = diagnose_scene(&dir, &varmap, |b| case_loss(&*model, &p.case, b)).unwrap();
    assert_eq!(d.finding.as_ref().unwrap().signature, found.signature);
    let top = &d.causes[0];
    assert_eq!(top.kind, CauseKind::CodeBug, "{:?}", d.causes);
    // The scene's case is its batch: the fix passes the failing step and
    // trains from the scene on that batch, judged by the case's rule.
    let fix = &top.fixes[0];
    assert!(top.passes_step() && top.verified(), "{:?}", top.fixes);
    assert!(
        fix.result.starts_with("stable and learning over 50 steps"),
        "{}",
        fix.result
    );
    assert!(fix
        .description
        .contains("trained from the scene on its batch"));
    assert!(top.title.contains("rownorm"), "{}", top.title);
    // Zeroing the stage is evidence of where the NaN comes from, not a fix.
    assert!(
        top.evidence
            .iter()
            .any(|e| e.starts_with("diagnostic, not a repair")),
        "{:?}",
        top.evidence
    );
    assert!(top
        .fixes
        .iter()
        .all(|f| !f.description.contains("set to 0")));

    // Adam with eps 0 on a parameter whose gradient is exactly 0: the eps
    // is the verified fix; no lower learning rate repairs 0/0.
    let mut case = p.case.clone();
    case.optimizer = nanhunt::spec::OptimizerSpec::Adam {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 0.0,
        weight_decay: 0.0,
    };
    case.data.pathologies.clear();
    let dir_root = crate::support::scratch("scene-diagnose-eps");
    let dir = dir_root.join("scene");
    let found = guarded_scene(&case, &gated, &dir);
    assert_eq!(
        (found.phase, found.stage.as_str()),
        (nanhunt::Phase::Update, "param.gate")
    );
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = gated(vb).unwrap();
    let d = diagnose_scene(&dir, &varmap, |b| case_loss(&*model, &case, b)).unwrap();
    let top = &d.causes[0];
    assert_eq!(top.kind, CauseKind::OptimizerEps, "{:?}", d.causes);
    assert!(top.passes_step(), "{:?}", top.fixes);
    let lr = d
        .causes
        .iter()
        .find(|c| c.kind == CauseKind::LearningRate)
        .unwrap();
    assert!(!lr.passes_step() && !lr.verified(), "{:?}", lr.fixes);
}

/// A loop whose optimizer keeps its state private (candle's own SGD):
/// the scene holds no optimizer state, so only the failing step replays;
/// its fixes pass it and are never called verified.
#[test]
fn a_scene_without_optimizer_state_judges_its_fixes_on_one_step_only() {
    use nanhunt::diagnose::{diagnose_scene, CauseKind, ONE_STEP};
    let p = planted_patterns()
        .into_iter()
        .find(|p| p.case.family() == "rownorm")
        .unwrap();
    let dir = crate::support::scratch("scene-diagnose-private").join("scene");
    guarded_scene_by(&p.case, &*p.factory, &dir, true);
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = p.factory.build(vb).unwrap();
    let d = diagnose_scene(&dir, &varmap, |b| case_loss(&*model, &p.case, b)).unwrap();
    let top = &d.causes[0];
    assert_eq!(top.kind, CauseKind::CodeBug, "{:?}", d.causes);
    assert!(top.passes_step() && !top.verified(), "{:?}", top.fixes);
    assert_eq!(top.fixes[0].result, ONE_STEP);
    assert!(d.causes.iter().all(|c| !c.verified()), "{:?}", d.causes);
}

/// An update failure is named at the op of the optimizer's op chain that
/// made it, with its line and explanation, by both drivers alike: Adam
/// with eps 0 on a parameter whose gradient is exactly 0 is 0/0 at
/// `m / denom`, whose eps adds nothing.
#[test]
fn an_update_failure_is_named_at_the_optimizers_op_by_both_drivers() {
    let mut case = planted_patterns().remove(0).case;
    case.optimizer = nanhunt::spec::OptimizerSpec::Adam {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 0.0,
        weight_decay: 0.0,
    };
    case.data.pathologies.clear();
    let ran = match run_model(&case, &gated, &RunOptions::default()).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("run_model found nothing: {}", other.verdict()),
    };
    let guarded = guarded(&case, &gated);
    for f in [&ran, &guarded] {
        assert_eq!(
            (f.phase, f.stage.as_str()),
            (nanhunt::Phase::Update, "param.gate")
        );
        let site = f
            .site
            .as_ref()
            .unwrap_or_else(|| panic!("no op: {}", f.detail));
        assert_eq!(
            (site.file.as_str(), site.text.as_str()),
            ("harness/src/optim/mod.rs", "&m / denom")
        );
        let source = std::fs::read_to_string(crate::support::root().join(&site.file)).unwrap();
        let line = source.lines().nth(site.line as usize - 1).unwrap();
        assert!(line.contains("&m / denom"), "line {}: {line}", site.line);
        let e = f.explanation.as_ref().unwrap();
        assert_eq!(
            e.pattern,
            nanhunt::explain::Pattern::ZeroOverZero,
            "{}",
            e.sentence
        );
        assert!(
            e.sentence.contains("the eps it adds is 0"),
            "{}",
            e.sentence
        );
    }
    assert_eq!(ran.site, guarded.site);
    assert_eq!(ran.explanation, guarded.explanation);
}

/// h / ‖h‖ after a ReLU, in an instrumented forward: both drivers name
/// the division at its line and explain it alike.
struct InstrumentedRowNorm {
    fc1: candle_nn::Linear,
    fc2: candle_nn::Linear,
}

impl Model for InstrumentedRowNorm {
    #[nanhunt::instrument]
    fn forward(&self, x: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
        use candle_core::Module;
        let h = self.fc1.forward(x)?.relu()?;
        let norm = h.sqr()?.sum_keepdim(candle_core::D::Minus1)?.sqrt()?;
        self.fc2.forward(&h.broadcast_div(&norm)?)
    }
}

#[test]
fn an_op_of_instrumented_code_is_the_same_finding_in_both_drivers() {
    let mut case = planted_patterns().remove(0).case;
    case.data.pathologies = vec![nanhunt::spec::Pathology::AllZero {
        fraction: 0.1,
        from_step: 0,
    }];
    let factory = |vb: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(InstrumentedRowNorm {
            fc1: candle_nn::linear_no_bias(8, 16, vb.pp("fc1"))?,
            fc2: candle_nn::linear(16, 4, vb.pp("fc2"))?,
        }))
    };
    let ran = match run_model(&case, &factory, &RunOptions::default()).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("run_model found nothing: {}", other.verdict()),
    };
    let guarded = guarded(&case, &factory);
    assert_eq!(
        (&guarded.signature, &guarded.stage, &guarded.site),
        (&ran.signature, &ran.stage, &ran.site)
    );
    let site = ran.site.as_ref().expect("the op");
    assert_eq!(site.text, "h.broadcast_div(&norm)");
    assert_eq!(ran.explanation, guarded.explanation);
    assert_eq!(
        ran.explanation.unwrap().pattern,
        nanhunt::explain::Pattern::ZeroNormRow
    );
}

/// A linear layer and a gate whose gradient is exactly 0 (it is
/// multiplied by 0): Adam with eps 0 divides 0 by 0 on it.
fn gated(vb: candle_nn::VarBuilder) -> candle_core::Result<Box<dyn Model>> {
    struct Gated(candle_nn::Linear, Tensor);
    impl Model for Gated {
        fn forward(&self, x: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
            let y = candle_core::Module::forward(&self.0, x)?;
            y.broadcast_add(&self.1.broadcast_mul(&self.1.zeros_like()?)?)
        }
    }
    let gate = vb.get_with_hints(4, "gate", candle_nn::Init::Const(0.5))?;
    Ok(Box::new(Gated(candle_nn::linear(8, 4, vb.pp("fc"))?, gate)))
}
