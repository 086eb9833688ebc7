//! The precision check of a finding, written once for both drivers: the
//! failing step re-run from the state before it in f32 (for a
//! half-precision step) and in f64, and with PyTorch's half-precision
//! rounding for the framework mark. How a step is re-run is the driver's
//! ([`Rerunner`]: the runner's session, the guard's rebuilt model); which
//! re-runs a check takes, and what they say, is this.

use crate::error::Result;
use crate::finding::{Finding, FrameworkMark, PrecisionCheck, Rerun, Zeros};
use crate::spec::HalfType;
use candle_core::{DType, Tensor};

/// A driver's re-run of a failing step at another precision.
pub(crate) trait Rerunner {
    /// The failing step computed in `dtype` (f32 or f64), with every
    /// stage's output and gradient stored in `storage` when given
    /// (PyTorch's half-precision rounding); with f64, also the exact zeros
    /// of the failing parameter's gradient for a NaN in the update
    /// ([`zero_gradients`]).
    fn rerun(&self, dtype: DType, storage: Option<HalfType>) -> Result<(Rerun, Option<Zeros>)>;
}

/// The precision check of `finding`, whose step computed in `dtype`,
/// re-run by `driver`.
pub(crate) fn check(
    finding: &Finding,
    dtype: DType,
    driver: &dyn Rerunner,
) -> Result<PrecisionCheck> {
    let half = HalfType::of_dtype(dtype);
    let mut check = if dtype == DType::F64 {
        PrecisionCheck::in_f64()
    } else {
        let f32_run = match half {
            Some(_) => Some(driver.rerun(DType::F32, None)?.0),
            None => None,
        };
        let (f64_run, zeros) = driver.rerun(DType::F64, None)?;
        PrecisionCheck::of(f32_run, f64_run, zeros)
    };
    let emulated = match half {
        Some(h) => Some(driver.rerun(DType::F32, Some(h))?.0),
        None => None,
    };
    check.framework = Some(FrameworkMark::of(finding, &check, emulated.as_ref()));
    Ok(check)
}

/// The exactly-zero elements of `vars[i]`'s gradient of `loss`, and how
/// many stay exactly zero when every variable moves by a seeded relative
/// 1e-6: structural zeros (a weight behind a dead unit, an embedding row
/// never indexed), which any framework's gradient has, where a zero that
/// moves came from rounding (a sum that cancelled exactly). The variables
/// are put back. `None` when the variable gets no gradient.
pub fn zero_gradients(
    vars: &[candle_core::Var],
    i: usize,
    mut loss: impl FnMut() -> Result<Tensor>,
) -> Result<Option<Zeros>> {
    let values = |loss: &mut dyn FnMut() -> Result<Tensor>| -> Result<Option<Vec<f64>>> {
        let grads = loss()?.backward()?;
        grads
            .get(vars[i].as_tensor())
            .map(|g| Ok(g.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?))
            .transpose()
    };
    let Some(first) = values(&mut loss)? else {
        return Ok(None);
    };
    let originals: Vec<Tensor> = vars
        .iter()
        .map(|v| v.as_tensor().copy())
        .collect::<candle_core::Result<_>>()?;
    let mut rng = crate::rng::Rng::keyed(0, "zero_gradients", i as u64);
    for v in vars.iter().filter(|v| v.dtype().is_float()) {
        let t = v.as_tensor();
        let factors: Vec<f64> = (0..t.elem_count())
            .map(|_| 1.0 + 1e-6 * rng.uniform_in(-1.0, 1.0))
            .collect();
        let factors = Tensor::from_vec(factors, t.shape(), t.device())?.to_dtype(t.dtype())?;
        v.set(&(t * factors)?)?;
    }
    let moved = values(&mut loss);
    for (v, o) in vars.iter().zip(&originals) {
        v.set(o)?;
    }
    let moved = moved?.unwrap_or_default();
    let exact = first.iter().filter(|&&g| g == 0.0).count();
    let structural = first
        .iter()
        .zip(&moved)
        .filter(|(&a, &b)| a == 0.0 && b == 0.0)
        .count();
    Ok(Some(Zeros { exact, structural }))
}
