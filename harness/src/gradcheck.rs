//! Finite-difference gradient checks in f64: for single ops and layers
//! ([`check_function`]) and for a whole case's model and loss ([`check_case`]).
//!
//! Candle ops can lose gradients silently (see `models::layers`); these checks
//! keep every op the zoo uses honest, and users can run them on their models.

use crate::error::{Error, Result};
use crate::models::{BuiltinFactory, ModelFactory, Tracer};
use crate::rng::Rng;
use crate::runner::{RunOptions, Session};
use crate::spec::{Case, Precision};
use candle_core::{DType, Tensor, Var};
use serde::Serialize;

/// Central-difference step.
pub const STEP: f64 = 1e-6;
/// A coordinate passes when |analytic - numeric| <= ATOL + RTOL * max(|a|, |n|).
/// In f64 the central difference has truncation error O(h^2 f''') ~ 1e-12 and
/// rounding error ~ e_f / h, where e_f (the error of evaluating the loss, a
/// few thousand f64 ops) is about 1e-14, i.e. ~ 1e-8: ATOL is ten times that.
/// The small step keeps ReLU and max-pool kinks from being crossed. A wrong
/// backward formula is off by O(|gradient|), far above RTOL.
pub const RTOL: f64 = 1e-5;
pub const ATOL: f64 = 1e-7;
/// Coordinates sampled per parameter tensor in whole-model checks.
pub const SAMPLES: usize = 6;
/// Op-level checks cover every coordinate of tensors up to this size.
pub const EXHAUSTIVE_LIMIT: usize = 512;

/// The comparison of one tensor's analytic and numeric gradients.
#[derive(Clone, Debug, Serialize)]
pub struct TensorCheck {
    pub name: String,
    pub checked: usize,
    pub max_abs_err: f64,
    pub max_rel_err: f64,
    /// Whether a gradient was produced at all.
    pub has_gradient: bool,
    pub passed: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct GradcheckReport {
    pub family: String,
    pub loss: String,
    pub rtol: f64,
    pub atol: f64,
    pub tensors: Vec<TensorCheck>,
    pub passed: bool,
}

fn relative_error(analytic: f64, numeric: f64) -> f64 {
    (analytic - numeric).abs() / analytic.abs().max(numeric.abs()).max(f64::MIN_POSITIVE)
}

fn within_tolerance(analytic: f64, numeric: f64) -> bool {
    (analytic - numeric).abs() <= ATOL + RTOL * analytic.abs().max(numeric.abs())
}

/// Compares `grad` (None = no gradient) with central differences of `eval`
/// at sampled coordinates of `x`; `set` installs a perturbed copy of `x`.
fn compare(
    name: &str,
    x: &Tensor,
    grad: Option<&Tensor>,
    samples: usize,
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
            passed: false,
        });
    };
    let analytic = grad.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let coords: Vec<usize> = rng
        .permutation(values.len())
        .into_iter()
        .take(samples)
        .collect();
    let (mut max_abs, mut max_rel, mut passed) = (0f64, 0f64, true);
    for &j in &coords {
        let mut probe = |delta: f64| -> Result<f64> {
            let mut v = values.clone();
            v[j] += delta;
            eval_at(&Tensor::from_vec(v, x.shape(), x.device())?.to_dtype(x.dtype())?)
        };
        let numeric = (probe(STEP)? - probe(-STEP)?) / (2.0 * STEP);
        max_abs = max_abs.max((analytic[j] - numeric).abs());
        max_rel = max_rel.max(relative_error(analytic[j], numeric));
        passed &= within_tolerance(analytic[j], numeric);
    }
    Ok(TensorCheck {
        name: name.to_string(),
        checked: coords.len(),
        max_abs_err: max_abs,
        max_rel_err: max_rel,
        has_gradient: true,
        passed,
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

/// Checks every trainable parameter's gradient of the case's loss on its first
/// batch, in f64, for a built-in family.
pub fn check_case(case: &Case) -> Result<GradcheckReport> {
    let factory = BuiltinFactory::new(&case.model).ok_or_else(|| {
        Error::invalid(
            "model.family",
            "a `custom` model needs its factory (use `check_model`)",
        )
    })?;
    check_model(case, &factory)
}

/// Like [`check_case`] for a user's own model.
pub fn check_model(case: &Case, factory: &dyn ModelFactory) -> Result<GradcheckReport> {
    let mut case = case.clone();
    case.precision = Precision::F64;
    let session = Session::new(&case, factory, &RunOptions::default())?;
    let batch = session.batch(0)?.map_err(|f| {
        Error::invalid(
            "data",
            format!(
                "the first batch is not finite ({}), so gradients cannot be checked",
                f.detail
            ),
        )
    })?;
    let loss = session.forward_loss(&batch, &mut Tracer::off())?.loss;
    let grads = loss.backward()?;
    let (names, vars) = session.vars();
    let mut rng = Rng::keyed(case.seed, "gradcheck.coords", 0);
    let mut tensors = Vec::new();
    for (name, var) in names.iter().zip(vars) {
        let original = var.as_tensor().copy()?;
        let check = compare(
            name,
            &original,
            grads.get(var.as_tensor()),
            SAMPLES,
            &mut rng,
            |x| {
                var.set(x)?;
                let l = session.forward_loss(&batch, &mut Tracer::off())?.loss;
                Ok(l.to_scalar::<f64>()?)
            },
        );
        var.set(&original)?;
        tensors.push(check?);
    }
    Ok(GradcheckReport {
        family: case.family().to_string(),
        loss: case.loss.name().to_string(),
        rtol: RTOL,
        atol: ATOL,
        passed: tensors.iter().all(|t| t.passed),
        tensors,
    })
}

#[cfg(test)]
mod tests;
