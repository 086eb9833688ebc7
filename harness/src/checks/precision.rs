//! The precision check of a finding, written once for both drivers: the
//! failing step re-run from the state before it in f32 (for a
//! half-precision step) and in f64, and with PyTorch's half-precision
//! rounding for the framework mark. How a step is re-run is the driver's
//! ([`Rerunner`]: the runner's session, the guard's rebuilt model); which
//! re-runs a check takes, and what they say, is this.

use crate::error::Result;
use crate::finding::{Finding, FrameworkMark, PrecisionCheck, Rerun, Zeros};
use crate::spec::HalfType;
use candle_core::DType;

/// A driver's re-run of a failing step at another precision.
pub(crate) trait Rerunner {
    /// The failing step computed in `dtype` (f32 or f64), with every
    /// stage's output and gradient stored in `storage` when given
    /// (PyTorch's half-precision rounding); with f64, also the exact zeros
    /// of the failing parameter's gradient for a NaN in the update
    /// ([`crate::probe::zero_gradients`]).
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
