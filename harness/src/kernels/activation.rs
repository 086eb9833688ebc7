//! ReLU and GELU as one op each way.
//!
//! candle's ReLU backward builds a comparison mask, converts it to floats
//! and multiplies (three passes and two buffers); here it is one pass. The
//! semantics are candle's, kept so that the fused and reference paths
//! agree on NaNs: relu(NaN) = 0, and the gradient is 1 where x ≥ 0.
//!
//! candle's GELU backward is nine element-wise ops with erf and exp
//! recomputed; here it is one pass with a rational erf (`Real::erf_fast`).

use super::{fused_for, slice, with_real, Real};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};

pub fn relu(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return x.relu();
    }
    x.contiguous()?.apply_op1(Relu)
}

struct Relu;

impl CustomOp1 for Relu {
    fn name(&self) -> &'static str {
        "nanhunt-relu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_real!(s, T => {
            let y: Vec<T> = slice::<T>(s, l)?
                .iter()
                .map(|&v| if v > T::zero() { v } else { T::zero() })
                .collect();
            Ok((T::to_cpu_storage_owned(y), l.shape().clone()))
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &ReluGrad)?))
    }
}

/// (x, grad) → grad where x ≥ 0, else 0.
struct ReluGrad;

impl CustomOp2 for ReluGrad {
    fn name(&self) -> &'static str {
        "nanhunt-relu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_real!(s1, T => {
            let dx: Vec<T> = slice::<T>(s1, l1)?
                .iter()
                .zip(slice::<T>(s2, l2)?)
                .map(|(&x, &g)| if x >= T::zero() { g } else { T::zero() })
                .collect();
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}

/// GELU with the exact erf form: x·(1 + erf(x/√2))/2.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return x.gelu_erf();
    }
    x.contiguous()?.apply_op1(Gelu)
}

struct Gelu;

fn gelu_value<T: Real>(x: T) -> T {
    let half = T::from(0.5).expect("representable");
    let inv_sqrt2 = T::from(std::f64::consts::FRAC_1_SQRT_2).expect("representable");
    half * x * (T::one() + (x * inv_sqrt2).erf_fast())
}

/// d/dx GELU = (1 + erf(x/√2))/2 + x·φ(x), φ the standard normal density.
fn gelu_slope<T: Real>(x: T) -> T {
    let half = T::from(0.5).expect("representable");
    let inv_sqrt2 = T::from(std::f64::consts::FRAC_1_SQRT_2).expect("representable");
    let inv_sqrt_2pi =
        T::from(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2)
            .expect("representable");
    half * (T::one() + (x * inv_sqrt2).erf_fast()) + x * inv_sqrt_2pi * (-half * x * x).exp()
}

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "nanhunt-gelu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_real!(s, T => {
            let y: Vec<T> = slice::<T>(s, l)?.iter().map(|&v| gelu_value(v)).collect();
            Ok((T::to_cpu_storage_owned(y), l.shape().clone()))
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &GeluGrad)?))
    }
}

/// (x, grad) → grad · GELU'(x).
struct GeluGrad;

impl CustomOp2 for GeluGrad {
    fn name(&self) -> &'static str {
        "nanhunt-gelu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_real!(s1, T => {
            let dx: Vec<T> = slice::<T>(s1, l1)?
                .iter()
                .zip(slice::<T>(s2, l2)?)
                .map(|(&x, &g)| g * gelu_slope(x))
                .collect();
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}
