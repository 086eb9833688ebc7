//! Finite-difference gradient checks in f64: for single ops and layers
//! ([`check_function`]) and for a whole case's model and loss ([`check_model`]).
//!
//! A whole-model check tells the truth about real models: one that cannot
//! run in f64 is checked in f32 at a tolerance derived from f32 rounding;
//! one that casts to f32 inside is detected and checked at that tolerance;
//! a disagreeing coordinate is re-checked at other steps, which separates a
//! wrong gradient from a near-singular point; NaN gradients, a non-finite
//! loss and tensors without a gradient are said plainly.
//!
//! Candle ops can lose gradients silently (see `models::layers`); these checks
//! keep every op the zoo uses honest, and users can run them on their models.

use crate::checks::gradient::{steadily_off, LARGER_STEP};
pub use crate::checks::gradient::{Tolerance, ATOL, ROUNDING_BUDGET, RTOL, STEP};
use crate::error::{Error, Result};
use crate::models::{BuiltinFactory, ModelFactory, Tracer};
use crate::rng::Rng;
use crate::runner::{RunOptions, Session};
use crate::spec::{Case, Precision};
use candle_core::{DType, Tensor, Var};
use serde::Serialize;

/// Coordinates sampled per parameter tensor in whole-model checks.
pub const SAMPLES: usize = 6;
/// Op-level checks cover every coordinate of tensors up to this size.
pub const EXHAUSTIVE_LIMIT: usize = 512;

/// How a tensor's analytic gradient compares with finite differences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within tolerance at the check's step.
    Agrees,
    /// The numeric derivative is the same at several step sizes and differs
    /// from the analytic one: a wrong gradient.
    Mismatch,
    /// The numeric derivative changes with the step size: the point is
    /// near-singular and the gradient cannot be judged there (not a pass).
    IllConditioned,
    /// The analytic gradient, or the loss near the point, is NaN or Inf.
    NonFinite,
    /// No gradient was produced at all.
    NoGradient,
}

impl Verdict {
    /// Whether the gradient is wrong (or missing) as far as the check can tell.
    pub fn fails(self) -> bool {
        matches!(
            self,
            Verdict::Mismatch | Verdict::NonFinite | Verdict::NoGradient
        )
    }

    /// The verdict's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::Mismatch => "mismatch",
            Verdict::IllConditioned => "ill_conditioned",
            Verdict::NonFinite => "non_finite",
            Verdict::NoGradient => "no_gradient",
        }
    }
}

/// The comparison of one tensor's analytic and numeric gradients.
#[derive(Clone, Debug, Serialize)]
pub struct TensorCheck {
    /// The tensor's name.
    pub name: String,
    /// Coordinates compared.
    pub checked: usize,
    /// The largest errors over the coordinates compared at the check's step.
    #[serde(with = "crate::floats::one")]
    pub max_abs_err: f64,
    /// The largest relative error.
    #[serde(with = "crate::floats::one")]
    pub max_rel_err: f64,
    /// Whether a gradient was produced at all.
    pub has_gradient: bool,
    /// What the comparison says.
    pub verdict: Verdict,
    /// What the verdict rests on, when it is not plain agreement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Whether it passed.
    pub passed: bool,
}

/// The precision a check ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckPrecision {
    /// f64.
    F64,
    /// f32, at a rounding-derived tolerance.
    F32,
}

/// A gradient check's result for a case.
#[derive(Clone, Debug, Serialize)]
pub struct GradcheckReport {
    /// The model family.
    pub family: String,
    /// The loss.
    pub loss: String,
    /// The dtype the model ran in.
    pub precision: CheckPrecision,
    /// Why the check did not run in f64 (the model's own error), if it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The tensors whose loss moves as if computed in f32 although the
    /// model runs in f64 (casts inside the model): they are checked at
    /// f32's tolerance instead of failing at f64's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lower_precision: Vec<String>,
    /// The checked point: the batch of this step, the case at this seed.
    pub batch: usize,
    /// The case seed.
    pub seed: u64,
    /// The loss at the checked point.
    #[serde(with = "crate::floats::one")]
    pub loss_value: f64,
    /// How the tolerance was chosen.
    pub tolerance: Tolerance,
    /// The relative tolerance.
    pub rtol: f64,
    /// The absolute tolerance.
    pub atol: f64,
    /// Each tensor's comparison.
    pub tensors: Vec<TensorCheck>,
    /// Weights their hint created as exact zeros (candle's `VarBuilder::get`
    /// default): a near-singular point often sits there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub zero_initialized: Vec<String>,
    /// The trainable tensors the backward pass did not reach, by module.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coverage: Option<crate::finding::GradientCoverage>,
    /// What kept the check from running (a non-finite loss at the point).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Whether every tensor passed.
    pub passed: bool,
}

impl GradcheckReport {
    /// The tensors with this verdict.
    pub fn with_verdict(&self, verdict: Verdict) -> Vec<&TensorCheck> {
        self.tensors
            .iter()
            .filter(|t| t.verdict == verdict)
            .collect()
    }
}

/// Where a whole-model check looks.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct GradcheckOptions {
    /// The step whose batch is checked.
    pub batch: usize,
    /// The case seed (parameters and data); `None`: the case's own.
    pub seed: Option<u64>,
    /// Coordinates sampled per tensor.
    pub samples: usize,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions {
            batch: 0,
            seed: None,
            samples: SAMPLES,
        }
    }
}

fn relative_error(analytic: f64, numeric: f64) -> f64 {
    (analytic - numeric).abs() / analytic.abs().max(numeric.abs()).max(f64::MIN_POSITIVE)
}

/// The other steps (as factors of the check's) a disagreeing coordinate is
/// re-checked at: one larger (where rounding matters less) and two smaller
/// (where truncation does).
const STEP_FACTORS: [f64; 3] = [LARGER_STEP, 0.1, 0.01];

/// Whether a tolerance can tell `a` from a gradient 10% off: a step so
/// small that rounding swamps the difference proves nothing by agreeing.
fn informative(tol: Tolerance, a: f64, n: f64) -> bool {
    tol.atol <= 0.1 * a.abs().max(n.abs())
}

/// One coordinate's verdict, and why when it is not agreement. Agreement
/// counts at the check's step, or at another step only where its tolerance
/// is informative; a numeric derivative steady across the check's step and
/// the larger one that disagrees is a wrong gradient whatever the smaller
/// steps say; one that moves with the step is ill-conditioned (never a pass).
fn judge(
    a: f64,
    j: usize,
    tol: Tolerance,
    mut numeric_at: impl FnMut(f64) -> Result<f64>,
) -> Result<(Verdict, Option<String>, f64)> {
    let numeric = numeric_at(tol.step)?;
    if !a.is_finite() {
        return Ok((
            Verdict::NonFinite,
            Some(format!("the analytic gradient is {a} at coordinate {j}")),
            numeric,
        ));
    }
    if !numeric.is_finite() {
        return Ok((
            Verdict::NonFinite,
            Some(format!(
                "the loss is not finite within {:e} of coordinate {j}",
                tol.step
            )),
            numeric,
        ));
    }
    if tol.holds(a, numeric) {
        return Ok((Verdict::Agrees, None, numeric));
    }
    let mut seen = vec![(tol.step, numeric)];
    for f in STEP_FACTORS {
        let h = tol.step * f;
        seen.push((h, numeric_at(h)?));
    }
    let estimates: Vec<String> = seen
        .iter()
        .map(|(h, n)| format!("{n:.6e} at step {h:.0e}"))
        .collect();
    let estimates = estimates.join(", ");
    let steady = steadily_off(a, numeric, seen[1].1, tol);
    let agrees_at = seen[1..]
        .iter()
        .find(|&&(h, n)| n.is_finite() && tol.at(h).holds(a, n) && informative(tol.at(h), a, n));
    let (verdict, why) = match (steady, agrees_at) {
        (true, _) => (
            Verdict::Mismatch,
            format!("coordinate {j}: analytic {a:.6e}, numeric {estimates}: steady across steps {:.0e} and {:.0e} and off the analytic value, so the gradient is wrong", tol.step, seen[1].0),
        ),
        (false, Some(&(h, _))) => (
            Verdict::IllConditioned,
            format!("coordinate {j}: the numeric derivative moves with the step ({estimates}) and meets the analytic {a:.6e} only at step {h:.0e}: the point is near-singular (a kink or a cliff)"),
        ),
        (false, None) => (
            Verdict::IllConditioned,
            format!("coordinate {j}: the numeric derivative moves with the step ({estimates}; analytic {a:.6e}) and meets the analytic value at no step whose tolerance could tell: the gradient cannot be judged here"),
        ),
    };
    Ok((verdict, Some(why), numeric))
}

/// The verdict that outranks: a wrong gradient, then a non-finite one, then
/// ill-conditioning, then agreement.
fn rank(v: Verdict) -> u8 {
    match v {
        Verdict::Agrees => 0,
        Verdict::IllConditioned => 1,
        Verdict::NoGradient => 2,
        Verdict::NonFinite => 3,
        Verdict::Mismatch => 4,
    }
}

/// Compares `grad` (None = no gradient) with central differences of `eval`
/// at sampled coordinates of `x`. A coordinate that disagrees is re-checked
/// at other steps: a wrong gradient stays wrong at every step, while at a
/// near-singular point the numeric derivative moves with the step.
fn compare(
    name: &str,
    x: &Tensor,
    grad: Option<&Tensor>,
    samples: usize,
    tol: Tolerance,
    rng: &mut Rng,
    mut eval_at: impl FnMut(&Tensor) -> Result<f64>,
) -> Result<TensorCheck> {
    let values = x.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let Some(grad) = grad else {
        return Ok(TensorCheck {
            name: name.to_string(),
            checked: 0,
            max_abs_err: f64::NAN,
            max_rel_err: f64::NAN,
            has_gradient: false,
            verdict: Verdict::NoGradient,
            note: Some("the backward pass produced no gradient for it".into()),
            passed: false,
        });
    };
    let analytic = grad.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let coords: Vec<usize> = rng
        .permutation(values.len())
        .into_iter()
        .take(samples)
        .collect();
    let (mut max_abs, mut max_rel) = (0f64, 0f64);
    let (mut verdict, mut note) = (Verdict::Agrees, None);
    for &j in &coords {
        let numeric_at = |h: f64| -> Result<f64> {
            let mut at = |delta: f64| -> Result<f64> {
                let mut v = values.clone();
                v[j] += delta;
                eval_at(&Tensor::from_vec(v, x.shape(), x.device())?.to_dtype(x.dtype())?)
            };
            Ok((at(h)? - at(-h)?) / (2.0 * h))
        };
        let a = analytic[j];
        let (v, why, numeric) = judge(a, j, tol, numeric_at)?;
        if a.is_finite() && numeric.is_finite() {
            max_abs = max_abs.max((a - numeric).abs());
            max_rel = max_rel.max(relative_error(a, numeric));
        }
        if rank(v) > rank(verdict) {
            (verdict, note) = (v, why);
        }
    }
    Ok(TensorCheck {
        name: name.to_string(),
        checked: coords.len(),
        max_abs_err: max_abs,
        max_rel_err: max_rel,
        has_gradient: true,
        // Ill-conditioned is no pass: it is evidence the check could not weigh.
        passed: verdict == Verdict::Agrees,
        verdict,
        note,
    })
}

/// Checks d(f)/d(inputs) of `f` at `inputs` (converted to f64), at every
/// coordinate of inputs up to [`EXHAUSTIVE_LIMIT`] elements.
/// Non-scalar outputs are reduced as Σ wᵢ·yᵢ with fixed random weights, so
/// every output element's gradient is exercised.
pub fn check_function(
    f: impl Fn(&[Tensor]) -> candle_core::Result<Tensor>,
    inputs: &[Tensor],
    seed: u64,
) -> Result<Vec<TensorCheck>> {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(&t.to_dtype(DType::F64)?))
        .collect::<candle_core::Result<_>>()?;
    let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let probe = f(&tensors)?;
    let mut wrng = Rng::keyed(seed, "gradcheck.weights", 0);
    let weights: Vec<f64> = (0..probe.elem_count()).map(|_| wrng.normal()).collect();
    let weights = Tensor::from_vec(weights, probe.shape(), probe.device())?;
    let scalar = |xs: &[Tensor]| -> Result<Tensor> {
        Ok((f(xs)?.to_dtype(DType::F64)? * &weights)?.sum_all()?)
    };
    let grads = scalar(&tensors)?.backward()?;
    let mut rng = Rng::keyed(seed, "gradcheck.coords", 0);
    let mut out = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let samples = if t.elem_count() <= EXHAUSTIVE_LIMIT {
            t.elem_count()
        } else {
            SAMPLES
        };
        let check = compare(
            &format!("input{i}"),
            t,
            grads.get(t),
            samples,
            Tolerance::F64,
            &mut rng,
            |x| {
                let mut xs: Vec<Tensor> = tensors.iter().map(|t| t.detach()).collect();
                xs[i] = x.clone();
                Ok(scalar(&xs)?.to_scalar::<f64>()?)
            },
        )?;
        out.push(check);
    }
    Ok(out)
}

/// Checks every trainable parameter's gradient of the case's loss at its
/// first batch, in f64, for a built-in family.
#[deprecated(note = "use `check_model(case, &BuiltinFactory::new(&case.model)?)`")]
pub fn check_case(case: &Case) -> Result<GradcheckReport> {
    check_model(case, &builtin(case)?)
}

/// Like [`check_model_with`], for a built-in family.
#[deprecated(note = "use `check_model_with(case, &BuiltinFactory::new(&case.model)?, opts)`")]
pub fn check_case_with(case: &Case, opts: &GradcheckOptions) -> Result<GradcheckReport> {
    check_model_with(case, &builtin(case)?, opts)
}

fn builtin(case: &Case) -> Result<BuiltinFactory> {
    BuiltinFactory::new(&case.model).ok_or_else(|| {
        Error::invalid(
            "model.family",
            "a `custom` model needs its factory (use `check_model`)",
        )
    })
}

/// Checks every trainable parameter's gradient of the case's loss at its
/// first batch, in f64 where the model runs in it: the default point of
/// [`check_model_with`].
pub fn check_model(case: &Case, factory: &dyn ModelFactory) -> Result<GradcheckReport> {
    check_model_with(case, factory, &GradcheckOptions::default())
}

/// The checked point: a session in the check's precision, its batch and loss.
struct Point<'a> {
    session: Session<'a>,
    batch: crate::data::HostBatch,
    loss: Tensor,
    precision: CheckPrecision,
}

impl<'a> Point<'a> {
    fn at(
        case: &Case,
        factory: &'a dyn ModelFactory,
        precision: CheckPrecision,
        step: usize,
    ) -> Result<Self> {
        let mut case = case.clone();
        case.precision = match precision {
            CheckPrecision::F64 => Precision::F64,
            CheckPrecision::F32 => Precision::F32,
        };
        let session = Session::new(&case, factory, &RunOptions::default())?;
        let batch = session.batch(step)?.map_err(|f| {
            Error::invalid(
                "data",
                format!(
                    "the batch of step {step} is not finite ({}), so gradients cannot be checked there",
                    f.detail
                ),
            )
        })?;
        let loss = session.forward_loss(&batch, &mut Tracer::off())?.loss;
        Ok(Point {
            session,
            batch,
            loss,
            precision,
        })
    }

    fn loss_at(&self) -> Result<f64> {
        let l = self
            .session
            .forward_loss(&self.batch, &mut Tracer::off())?
            .loss;
        Ok(l.to_dtype(DType::F64)?.to_scalar::<f64>()?)
    }
}

/// Like [`check_model`], at the point `opts` chooses. A model that cannot
/// run in f64 (a fused candle op without an f64 kernel) is checked in f32,
/// at f32's tolerance, and the report says why.
pub fn check_model_with(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &GradcheckOptions,
) -> Result<GradcheckReport> {
    let mut case = case.clone();
    if let Some(seed) = opts.seed {
        case.seed = seed;
    }
    let (point, fallback) = match Point::at(&case, factory, CheckPrecision::F64, opts.batch) {
        Ok(p) => (p, None),
        Err(Error::Candle(e)) => (
            Point::at(&case, factory, CheckPrecision::F32, opts.batch)?,
            Some(format!(
                "the model does not run in f64 ({})",
                Error::Candle(e)
            )),
        ),
        Err(e) => return Err(e),
    };
    let loss_value = point.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    let tolerance = match point.precision {
        CheckPrecision::F64 => Tolerance::F64,
        CheckPrecision::F32 => Tolerance::f32(loss_value),
    };
    let mut report = GradcheckReport {
        family: case.family().to_string(),
        loss: case.loss.name().to_string(),
        precision: point.precision,
        fallback,
        lower_precision: Vec::new(),
        batch: opts.batch,
        seed: case.seed,
        loss_value,
        tolerance,
        rtol: tolerance.rtol,
        atol: tolerance.atol,
        tensors: Vec::new(),
        zero_initialized: point.session.params().zero_initialized(),
        coverage: None,
        problem: None,
        passed: false,
    };
    if !loss_value.is_finite() {
        report.problem = Some(format!(
            "the loss is {loss_value} at the checked point (the batch of step {}, seed {}): gradients cannot be checked there; `run` names where it turns non-finite, or choose another batch or seed",
            opts.batch, case.seed
        ));
        return Ok(report);
    }
    let (names, vars) = point.session.vars();
    let grads = match point.loss.backward() {
        Ok(g) => g,
        Err(e) => match crate::backward::unsupported(&e) {
            Some(u) => {
                report.problem = Some(crate::checks::unsupported_backward(u).detail);
                return Ok(report);
            }
            None => return Err(e.into()),
        },
    };
    report.coverage = crate::coverage::of(names, vars, &grads, &[]);
    let mut rng = Rng::keyed(case.seed, "gradcheck.coords", 0);
    for (name, var) in names.iter().zip(vars) {
        let original = var.as_tensor().copy()?;
        let grad = grads.get(var.as_tensor());
        let result = (|| {
            let mut eval = |x: &Tensor| -> Result<f64> {
                var.set(x)?;
                point.loss_at()
            };
            // Casts inside the model: checked at f32's tolerance instead.
            let lowered = point.precision == CheckPrecision::F64
                && match grad {
                    Some(g) => computes_below_f64(&original, g, loss_value, &mut eval)?,
                    None => false,
                };
            let tol = if lowered {
                Tolerance::f32(loss_value)
            } else {
                tolerance
            };
            let check = compare(name, &original, grad, opts.samples, tol, &mut rng, eval)?;
            Ok::<_, Error>((check, lowered))
        })();
        var.set(&original)?;
        let (mut check, lowered) = result?;
        if lowered {
            report.lower_precision.push(name.clone());
            check.note.get_or_insert_with(|| {
                "the loss moves as if computed in f32: checked at f32's tolerance".into()
            });
        }
        if check.verdict == Verdict::IllConditioned && report.zero_initialized.contains(name) {
            if let Some(note) = &mut check.note {
                note.push_str(&format!(
                    "; `{name}` starts at exact zeros (its hint is Init::Const(0), candle's default for `VarBuilder::get`): give it a `model.init_overrides` entry"
                ));
            }
        }
        report.tensors.push(check);
    }
    report.passed = report.tensors.iter().all(|t| t.passed);
    Ok(report)
}

/// Whether the loss, though the model runs in f64, moves as if computed in
/// a lower precision along `x`'s most sensitive coordinate: five
/// evaluations 1e-9 apart either are all equal although the gradient says
/// f64 would see them differ, or are rougher than f64 rounding allows
/// (second differences above 1e-11 of the loss: f64's are about 1e-14,
/// f32's 1e-7).
fn computes_below_f64(
    x: &Tensor,
    grad: &Tensor,
    loss: f64,
    eval: &mut impl FnMut(&Tensor) -> Result<f64>,
) -> Result<bool> {
    let g = grad.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let Some((j, &a)) = g
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .max_by(|p, q| p.1.abs().total_cmp(&q.1.abs()))
    else {
        return Ok(false);
    };
    let values = x.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let delta = 1e-9 * values[j].abs().max(1e-3);
    let scale = loss.abs().max(f64::MIN_POSITIVE);
    if a.abs() * delta < 1e-12 * scale {
        // Too flat here for f64 itself to register the steps.
        return Ok(false);
    }
    let mut v = Vec::with_capacity(5);
    for k in -2..=2 {
        let mut p = values.clone();
        p[j] += f64::from(k) * delta;
        v.push(eval(&Tensor::from_vec(p, x.shape(), x.device())?)?);
    }
    if v.iter().all(|&y| y == v[0]) {
        return Ok(true);
    }
    let rough = v
        .windows(3)
        .map(|w| (w[2] - 2.0 * w[1] + w[0]).abs())
        .fold(0f64, f64::max);
    Ok(rough > 1e-11 * scale)
}

#[cfg(test)]
mod tests;
