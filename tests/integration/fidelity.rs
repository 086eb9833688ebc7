//! Findings say whether they survive higher precision and reference
//! rounding: the failing step is re-run from the same state in f32 (for half
//! precision) and in f64 (`nanhunt::fidelity`). Each test rebuilds one of
//! the known places where candle's numerics decide a finding
//! (docs/NUMERICS.md).

use crate::support::*;
use candle_core::{Tensor, D};
use candle_nn::{linear, Linear, Module, VarBuilder};
use nanhunt::fidelity::{CandleRule, FrameworkVerdict, Robustness};
use nanhunt::finding::OpKind;
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::*;
use nanhunt::{run_model, Finding, Outcome, RunOptions};

fn vector_case(name: &str, features: usize, precision: Precision) -> Case {
    let mut case = Case::example("cnn").unwrap();
    case.model = ModelSpec::Custom(CustomSpec::new(name, InputSpec::Vector { features }, 4));
    case.precision = precision;
    case.optimizer = sgd(1e-2);
    case.steps = 5;
    case
}

fn finding_of(case: &Case, factory: &dyn nanhunt::models::ModelFactory) -> Finding {
    match run_model(case, factory, &RunOptions::default()).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("expected a finding, got {other:?}"),
    }
}

/// The finding's framework mark: would PyTorch fail too, and if not, on
/// which of candle's rules it hangs.
fn framework(f: &Finding) -> (FrameworkVerdict, Option<CandleRule>) {
    let mark = f
        .precision
        .as_ref()
        .and_then(|c| c.framework.as_ref())
        .expect("every checked finding has a framework mark");
    (mark.verdict, mark.rule)
}

/// Whether PyTorch showed what a finding rests on in case `id`, as
/// `scripts/pytorch-rules.py` recorded it in `docs/pytorch-rules.csv`.
fn pytorch_fails_too(id: &str) -> bool {
    let path = root().join("docs/pytorch-rules.csv");
    let mut table = csv::Reader::from_path(&path).unwrap();
    let headers = table.headers().unwrap().clone();
    let column = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (case, fails) = (column("id"), column("fails_too"));
    let row = table
        .records()
        .map(Result::unwrap)
        .find(|r| &r[case] == id)
        .unwrap_or_else(|| panic!("no case `{id}` in {}", path.display()));
    &row[fails] == "true"
}

/// Asserts that `f`'s framework mark says what PyTorch did in the case
/// `id` of the recorded table: "PyTorch would fail too" where PyTorch
/// failed, candle-specific where it did not.
pub(crate) fn assert_mark_matches_pytorch(f: &Finding, id: &str) {
    let want = match pytorch_fails_too(id) {
        true => FrameworkVerdict::FailsToo,
        false => FrameworkVerdict::CandleSpecific,
    };
    assert_eq!(framework(f).0, want, "PyTorch's case `{id}`: {f:?}");
}

fn verdict(f: &Finding) -> Robustness {
    f.precision
        .as_ref()
        .expect("every run finding is checked")
        .verdict
}

/// A layer norm written with candle's ops: in f16 the variance of
/// projections in the hundreds squares past 65504 to Inf (and the output
/// silently becomes zeros); PyTorch takes half-precision norm statistics
/// in f32.
struct PlainLayerNorm {
    proj: Linear,
    head: Linear,
}

impl Model for PlainLayerNorm {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("proj", self.proj.forward(x)?)?;
        let centered = h.broadcast_sub(&h.mean_keepdim(D::Minus1)?)?;
        let var = tr.record("ln.var", centered.sqr()?.mean_keepdim(D::Minus1)?)?;
        let normed = tr.record("ln", centered.broadcast_div(&(var + 1e-5)?.sqrt()?)?)?;
        tr.record("head", self.head.forward(&normed)?)
    }
}

#[test]
fn an_f16_layer_norm_variance_overflow_is_precision_dependent() {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(PlainLayerNorm {
            proj: linear(8, 16, vb.pp("proj"))?,
            head: linear(16, 4, vb.pp("head"))?,
        }))
    };
    let mut case = vector_case("plain_layer_norm", 8, Precision::F16);
    case.data.scale = 1e4;
    let f = finding_of(&case, &factory);
    assert_eq!(f.stage, "ln.var", "{f:?}");
    assert_eq!(verdict(&f), Robustness::PrecisionDependent, "{f:?}");
    // The same hand-written norm in PyTorch squares in f16 too (its
    // LayerNorm module would not): the variance is past 65504 there.
    assert_eq!(framework(&f), (FrameworkVerdict::FailsToo, None), "{f:?}");
    let check = f.precision.as_ref().unwrap();
    assert_eq!(check.reruns.len(), 2, "f32 and f64: {check:?}");
    assert!(
        check.reruns.iter().all(|r| r.ran && !r.reproduced),
        "{check:?}"
    );
    assert!(
        check.summary().starts_with("precision-dependent"),
        "{}",
        check.summary()
    );
    // The same model in f32 trains: the finding is f16's range alone.
    case.precision = Precision::F32;
    let stable = run_model(&case, &factory, &RunOptions::default()).unwrap();
    assert!(matches!(stable, Outcome::Stable { .. }), "{stable:?}");
    assert_mark_matches_pytorch(&f, "hand_variance_f16");
}

/// A mean over 128 features of values near 600: the sum (≈ 77000) passes
/// f16's 65504 in candle's f16 accumulator, where PyTorch accumulates
/// half-precision reductions in f32 and gets ≈ 600.
struct WideMean {
    head: Linear,
}

impl Model for WideMean {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let m = tr.record_as("mean", OpKind::Reduce, x.mean_keepdim(D::Minus1)?)?;
        let features = x.broadcast_sub(&m)?;
        tr.record("head", self.head.forward(&features)?)
    }
}

#[test]
fn an_f16_accumulation_overflow_is_precision_dependent() {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(WideMean {
            head: linear(128, 4, vb.pp("head"))?,
        }))
    };
    let mut case = vector_case("wide_mean", 128, Precision::F16);
    case.data.offset = 600.0;
    case.data.scale = 1.0;
    let f = finding_of(&case, &factory);
    assert_eq!(f.stage, "mean", "{f:?}");
    assert_eq!(verdict(&f), Robustness::PrecisionDependent, "{f:?}");
    // PyTorch's mean accumulates in f32: 600, then stored in f16.
    assert_eq!(
        framework(&f),
        (
            FrameworkVerdict::CandleSpecific,
            Some(CandleRule::HalfAccumulation)
        ),
        "{f:?}"
    );
    assert_mark_matches_pytorch(&f, "half_mean");
}

/// Adam with eps 0 behind ReLU units that are dead for the whole batch:
/// their gradient is exactly 0.0, so m̂/√v̂ is 0/0. It reproduces in f64
/// and is marked as hanging on exact zeros.
struct DeadUnits {
    hidden: Linear,
    head: Linear,
}

impl Model for DeadUnits {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        // Inputs are positive and the hidden weights start negative: dead.
        let h = tr.record("hidden", nanhunt::kernels::relu(&self.hidden.forward(x)?)?)?;
        tr.record("head", self.head.forward(&h)?)
    }
}

/// The finding of Adam with `eps` at `precision` behind units dead for the
/// whole batch (positive inputs, hidden weights of −0.5).
fn dead_units_finding(precision: Precision, eps: f64) -> Finding {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(DeadUnits {
            hidden: linear(8, 16, vb.pp("hidden"))?,
            head: linear(16, 4, vb.pp("head"))?,
        }))
    };
    let mut case = vector_case("dead_units", 8, precision);
    case.data.offset = 5.0;
    case.optimizer = OptimizerSpec::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps,
        weight_decay: 0.0,
    };
    if let ModelSpec::Custom(c) = &mut case.model {
        c.init_overrides
            .insert("hidden.weight".into(), InitOverride::Const { value: -0.5 });
    }
    finding_of(&case, &factory)
}

#[test]
fn adam_eps_zero_on_structural_zero_gradients_hangs_on_them_and_fails_in_pytorch_too() {
    let f = dead_units_finding(Precision::F32, 0.0);
    assert_eq!(f.kind, nanhunt::FindingKind::Nan, "{f:?}");
    assert_eq!(f.phase, nanhunt::Phase::Update, "{f:?}");
    assert_eq!(verdict(&f), Robustness::HangsOnExactZeros, "{f:?}");
    let check = f.precision.as_ref().unwrap();
    assert!(check.exact_zero_gradients.unwrap() > 0, "{check:?}");
    assert!(check.reruns[0].reproduced, "{check:?}");
    // The zeros are structural (weights behind dead units stay dead when
    // the parameters move by 1e-6): PyTorch's gradient is 0.0 there too,
    // and Adam with eps 0 divides 0 by 0 there as well.
    assert_eq!(
        check.structural_zero_gradients, check.exact_zero_gradients,
        "{check:?}"
    );
    assert_eq!(framework(&f), (FrameworkVerdict::FailsToo, None));
    let note = &check.framework.as_ref().unwrap().note;
    assert!(note.contains("structural"), "{note}");
    assert_mark_matches_pytorch(&f, "dead_unit_gradient");
}

/// Adam on f16 parameters behind dead ReLU units: eps 1e-8 is 0 in f16,
/// so m̂/(√v̂ + eps) is 0/0 where the gradient is exactly 0. PyTorch's
/// `torch.optim.Adam` on f16 parameters computes its update in f16
/// (`exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` in the
/// parameters' dtype) and fails the same way; the framework check computes
/// the update in the parameters' dtype as it does, so the finding is not
/// candle's.
#[test]
fn an_f16_adam_update_is_judged_with_the_update_in_f16_as_torch_optim_computes_it() {
    let f = dead_units_finding(Precision::F16, 1e-8);
    println!("{}: {}", f.signature, f.detail);
    let check = f.precision.as_ref().unwrap();
    println!("{}", check.summary());
    assert_eq!(f.phase, nanhunt::Phase::Update, "{f:?}");
    // In f32 eps 1e-8 is not 0: the step is healthy.
    assert!(!check.reruns[0].reproduced, "{check:?}");
    assert_eq!(
        framework(&f),
        (FrameworkVerdict::FailsToo, None),
        "{check:?}"
    );
    let note = &check.framework.as_ref().unwrap().note;
    assert!(note.contains("the update in f16"), "{note}");
    assert_mark_matches_pytorch(&f, "adam_f16");
}

/// A batch with values past 65504 in an f16 case: a PyTorch user casts the
/// batch to the model's dtype (`x.half()`), where they are inf as well. The
/// framework check holds the batch to the half dtype as that cast does, so
/// the finding is not candle's.
#[test]
fn an_f16_batch_past_the_dtypes_range_fails_in_pytorch_too_once_the_batch_is_cast() {
    let mut case = Case::example("cnn").unwrap();
    case.precision = Precision::F16;
    case.data.scale = 2e4;
    let f = finding_of(
        &case,
        &nanhunt::models::BuiltinFactory::new(&case.model).unwrap(),
    );
    assert_eq!(
        (f.kind, f.phase),
        (nanhunt::FindingKind::Overflow, nanhunt::Phase::Data),
        "{f:?}"
    );
    let check = f.precision.as_ref().unwrap();
    assert_eq!(
        framework(&f),
        (FrameworkVerdict::FailsToo, None),
        "{check:?}"
    );
    assert_mark_matches_pytorch(&f, "batch_cast");
}

/// exp of logits near 100 overflows f32 (e^89 is past f32's range) and
/// not f64: an f32 finding that is gone in f64 is precision-dependent.
struct ExpHead {
    head: Linear,
}

impl Model for ExpHead {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let z = tr.record("head", self.head.forward(x)?)?;
        tr.record("exp", z.exp()?)
    }
}

#[test]
fn an_f32_overflow_gone_in_f64_is_precision_dependent_and_an_lr_divergence_reproduces() {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(ExpHead {
            head: linear(8, 4, vb.pp("head"))?,
        }))
    };
    let mut case = vector_case("exp_head", 8, Precision::F32);
    case.data.scale = 100.0;
    let f = finding_of(&case, &factory);
    assert_eq!(f.stage, "exp", "{f:?}");
    assert_eq!(verdict(&f), Robustness::PrecisionDependent, "{f:?}");
    assert_eq!(f.precision.as_ref().unwrap().reruns.len(), 1, "f64 only");
    // f32's range is f32's in PyTorch too.
    assert_eq!(framework(&f), (FrameworkVerdict::FailsToo, None));

    // A learning rate far too high diverges at any precision.
    let mut case = Case::example("cnn").unwrap();
    case.optimizer = sgd(1e3);
    let f = match nanhunt::run(&case).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("{other:?}"),
    };
    assert_eq!(verdict(&f), Robustness::ReproducesInF64, "{f:?}");
}

/// candle's square-root backward divides before it halves, (g/√x)·0.5,
/// so in f16 it overflows for g/√x in (65504, 131008), where PyTorch's
/// g/(2√x) is finite; under dynamic loss scaling that costs the scaler a
/// halving. When this fails, candle changed its rule: update
/// docs/NUMERICS.md.
#[test]
fn candle_sqrt_backward_divides_before_halving_in_f16() {
    let x = candle_core::Var::from_tensor(
        &Tensor::new(&[1e-4f32], &candle_core::Device::Cpu)
            .unwrap()
            .to_dtype(candle_core::DType::F16)
            .unwrap(),
    )
    .unwrap();
    let y = (x.as_tensor().sqrt().unwrap() * 1000.0).unwrap();
    let g = y.sum_all().unwrap().backward().unwrap();
    let g = g
        .get(x.as_tensor())
        .unwrap()
        .to_dtype(candle_core::DType::F32)
        .unwrap();
    // 1000 / 0.01 = 1e5 overflows f16 before the halving; 1000 / 0.02 = 5e4 would not.
    assert_eq!(g.to_vec1::<f32>().unwrap(), [f32::INFINITY]);
}

/// candle's f16 reductions accumulate in f16: the sum of 128 values of 600
/// is Inf (PyTorch: 76800, accumulated in f32 and then out of f16's range
/// only at the very end, and its mean 600 is exact). When this fails,
/// candle accumulates wider now: update docs/NUMERICS.md.
#[test]
fn candle_f16_mean_accumulates_in_f16() {
    let x = Tensor::full(600f32, 128, &candle_core::Device::Cpu)
        .unwrap()
        .to_dtype(candle_core::DType::F16)
        .unwrap();
    let m = x
        .mean_all()
        .unwrap()
        .to_dtype(candle_core::DType::F32)
        .unwrap();
    assert_eq!(m.to_scalar::<f32>().unwrap(), f32::INFINITY);
}

/// The checked-in f16 batch-norm reproducer: the backward of `block0.bn`
/// sums 121 gradient values of hundreds in an f16 accumulator past 65504
/// (PyTorch accumulates in f32). The finding is marked precision-dependent:
/// the f32 and f64 re-runs of its step are healthy.
#[test]
fn the_f16_batch_norm_backward_overflow_is_precision_dependent() {
    let repro = nanhunt::repro::Reproducer::load(
        &root().join("corpora/repro/overflow-backward-block.bn-cnn-sgd-f16-cpu-8f5bab87.json"),
    )
    .unwrap();
    let f = match nanhunt::run(&repro.case).unwrap() {
        Outcome::Unstable { finding } => *finding,
        other => panic!("{other:?}"),
    };
    assert_eq!(f.stage, "block0.bn", "{f:?}");
    assert_eq!(verdict(&f), Robustness::PrecisionDependent, "{f:?}");
    // PyTorch's batch norm sums its backward in f32.
    assert_eq!(
        framework(&f),
        (
            FrameworkVerdict::CandleSpecific,
            Some(CandleRule::HalfNormStatistics)
        ),
        "{f:?}"
    );
}

#[test]
fn a_rerun_that_fails_otherwise_than_the_finding_never_reproduces_it() {
    use nanhunt::fidelity::{PrecisionCheck, Rerun};
    let case: Case = Case::from_json(
        &std::fs::read_to_string(root().join("corpora/datasets/digits/digits_lr_too_high.json"))
            .unwrap(),
    )
    .map(|mut c| {
        c.resolve_paths(&root().join("corpora/datasets/digits"));
        c
    })
    .unwrap();
    let factory = nanhunt::models::BuiltinFactory::new(&case.model).unwrap();
    let finding = finding_of(&case, &factory);
    // The same failure again reproduces it.
    let again = Rerun::ran("f64", &finding, Some(&finding), None);
    assert!(again.reproduced && !again.differs, "{again:?}");
    // A failure elsewhere does not: "fails differently", and so does the verdict.
    let mut elsewhere = finding.clone();
    elsewhere.stage = "loss.somewhere_else".into();
    let other = Rerun::ran("f64", &finding, Some(&elsewhere), None);
    assert!(!other.reproduced && other.differs, "{other:?}");
    assert!(
        other.note.starts_with("fails differently: "),
        "{}",
        other.note
    );
    let check = PrecisionCheck::of(None, other, None);
    assert_eq!(check.verdict, Robustness::FailsDifferently);
    // An overflow past f16's range is an infinity in f64: the same failure.
    let mut overflow = finding.clone();
    overflow.kind = nanhunt::FindingKind::Overflow;
    let mut inf = finding.clone();
    inf.kind = nanhunt::FindingKind::Inf;
    assert!(Rerun::ran("f64", &overflow, Some(&inf), None).reproduced);
}

/// candle's `affine` rounds its multiplier to the tensor's dtype first: in
/// f16 `f32::MIN` becomes −inf, and a masked position's 0 · (−inf) is NaN
/// where PyTorch's `(1 − keep) · f32::MIN` multiplies in f32 and gives −0.
#[test]
fn candle_f16_affine_rounds_its_multiplier_to_f16_first() {
    let zero = Tensor::zeros(1, candle_core::DType::F16, &candle_core::Device::Cpu).unwrap();
    let masked = zero.affine(f64::from(f32::MIN), 0.0).unwrap();
    let v = masked
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert!(v[0].is_nan(), "{v:?}");
    // In f32 the same product is -0: the rule is f16's.
    let zero32 = zero.to_dtype(candle_core::DType::F32).unwrap();
    let v = zero32
        .affine(f64::from(f32::MIN), 0.0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(v[0], 0.0);
}

/// candle's softmax of a row masked everywhere (every logit −inf) is NaN;
/// PyTorch's `scaled_dot_product_attention` returns zeros for such rows, so
/// a fully-masked-row finding is candle's (and PyTorch's plain softmax's).
#[test]
fn candle_softmax_of_a_fully_masked_row_is_nan() {
    let row = Tensor::full(f32::NEG_INFINITY, (1, 4), &candle_core::Device::Cpu).unwrap();
    let p = candle_nn::ops::softmax(&row, D::Minus1)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert!(p[0].iter().all(|v| v.is_nan()), "{p:?}");
}

/// Scores masked additively with `(1 − keep) · f32::MIN` written with
/// candle's `affine`, in f16: the multiplier rounds to −inf first, so the
/// kept positions are 0 · (−inf) = NaN where PyTorch has −0.
struct AffineMask {
    proj: Linear,
    head: Linear,
}

impl Model for AffineMask {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let scores = tr.record_as("scores", OpKind::Linear, self.proj.forward(x)?)?;
        let keep = Tensor::new(&[1f32, 1.0, 0.0, 0.0], x.device())?.to_dtype(x.dtype())?;
        let dropped = keep.affine(-1.0, 1.0)?;
        let mask = tr.record_as(
            "mask",
            OpKind::Mask,
            dropped.affine(f64::from(f32::MIN), 0.0)?,
        )?;
        let weights = tr.record_as(
            "weights",
            OpKind::Softmax,
            candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?,
        )?;
        tr.record("head", self.head.forward(&weights)?)
    }
}

#[test]
fn an_f16_affine_mask_is_candle_specific_and_names_the_rule() {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(AffineMask {
            proj: linear(8, 4, vb.pp("proj"))?,
            head: linear(4, 4, vb.pp("head"))?,
        }))
    };
    let case = vector_case("affine_mask", 8, Precision::F16);
    let f = finding_of(&case, &factory);
    assert_eq!(
        (f.kind, f.stage.as_str()),
        (nanhunt::FindingKind::Nan, "mask"),
        "{f:?}"
    );
    assert_eq!(
        framework(&f),
        (
            FrameworkVerdict::CandleSpecific,
            Some(CandleRule::HalfAffine)
        ),
        "{f:?}"
    );
    // In f32 the mask is finite and the model trains.
    let mut case = case;
    case.precision = Precision::F32;
    let stable = run_model(&case, &factory, &RunOptions::default()).unwrap();
    assert!(matches!(stable, Outcome::Stable { .. }), "{stable:?}");
    assert_mark_matches_pytorch(&f, "half_affine_mask");
}

/// sqrt(h² + 1e-4) at h = 0 scaled by 1e4 into the logits, in f16: the
/// gradient reaching the root is 937.5, and candle's (g/√x)·0.5 passes
/// f16's 65504 (9.4e4) where PyTorch's g/(2√x) is 4.7e4.
struct RootNearZero {
    proj: Linear,
}

impl Model for RootNearZero {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record_as("proj", OpKind::Linear, self.proj.forward(x)?)?;
        let r = tr.record_as("root", OpKind::Sqrt, (h.sqr()? + 1e-4)?.sqrt()?)?;
        tr.record("logits", (r * 1e4)?)
    }
}

#[test]
fn an_f16_sqrt_backward_overflow_is_candle_specific_and_names_the_rule() {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(RootNearZero {
            proj: linear(8, 4, vb.pp("proj"))?,
        }))
    };
    let mut case = vector_case("root_near_zero", 8, Precision::F16);
    case.batch_size = 8;
    if let ModelSpec::Custom(c) = &mut case.model {
        for t in ["proj.weight", "proj.bias"] {
            c.init_overrides
                .insert(t.into(), InitOverride::Const { value: 0.0 });
        }
    }
    let f = finding_of(&case, &factory);
    assert_eq!(
        (f.phase, f.stage.as_str()),
        (nanhunt::Phase::Backward, "root"),
        "{f:?}"
    );
    assert_eq!(
        framework(&f),
        (
            FrameworkVerdict::CandleSpecific,
            Some(CandleRule::SqrtBackward)
        ),
        "{f:?}"
    );
    assert_mark_matches_pytorch(&f, "sqrt_backward");
}

/// Two scalings inside one function with nothing recorded by name: in f16
/// the second passes 65504 (in PyTorch too: each op rounds its result to
/// f16), though the quotient after it would bring the value back in
/// range. The framework re-run rounds each op of instrumented code as
/// PyTorch does, so the finding is not candle's.
#[nanhunt::instrument]
fn scaled_twice(n: &crate::op_sight::Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let big = (n.fc1.forward(x)? * 1000.0)?;
    let bigger = (big * 100.0)?;
    n.fc2.forward(&(bigger / 1e5)?)
}

#[test]
fn an_f16_overflow_between_two_ops_of_one_function_fails_in_pytorch_too() {
    use crate::op_sight::{net, vector, MLP};
    let mut case = vector("scaled_twice");
    case.precision = Precision::F16;
    let f = finding_of(&case, &net(MLP, scaled_twice));
    let check = f.precision.as_ref().unwrap();
    println!("{}: {}\n{}", f.signature, f.detail, check.summary());
    assert_eq!(f.phase, nanhunt::Phase::Forward, "{f:?}");
    assert!(
        f.site
            .as_ref()
            .is_some_and(|s| s.text.contains("big * 100.0")),
        "{f:?}"
    );
    // In f32 the step is healthy; with each op rounded to f16 it is not.
    assert!(!check.reruns[0].reproduced, "{check:?}");
    assert_eq!(
        framework(&f),
        (FrameworkVerdict::FailsToo, None),
        "{check:?}"
    );
    assert_mark_matches_pytorch(&f, "two_scalings_f16");
}
