//! ReLU and GELU as one op each way.
//!
//! candle's ReLU backward builds a comparison mask, converts it to floats
//! and multiplies (three passes and two buffers); GELU's is nine
//! element-wise ops with erf and exp recomputed. Here each is one pass
//! (GELU with a rational erf, `Real::erf_fast`). The semantics are
//! candle's, so that the fused and reference paths agree on NaNs:
//! relu(NaN) = 0, and the gradient is the incoming gradient times the
//! slope (a NaN gradient stays NaN where x < 0, as NaN·0 does).

use super::{fused_for, real, slice, with_real, Real};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};

pub fn relu(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return x.relu();
    }
    x.contiguous()?.apply_op1(Pointwise(Activation::Relu))
}

/// GELU with the exact erf form: x·(1 + erf(x/√2))/2.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return x.gelu_erf();
    }
    x.contiguous()?.apply_op1(Pointwise(Activation::Gelu))
}

#[derive(Clone, Copy)]
enum Activation {
    Relu,
    Gelu,
}

impl Activation {
    fn value<T: Real>(self, x: T) -> T {
        match self {
            Activation::Relu => {
                if x > T::zero() {
                    x
                } else {
                    T::zero()
                }
            }
            Activation::Gelu => {
                let half: T = real(0.5);
                half * x * (T::one() + (x * real(std::f64::consts::FRAC_1_SQRT_2)).erf_fast())
            }
        }
    }

    /// dy/dx: for ReLU 1 where x ≥ 0 (candle's choice at 0); for GELU
    /// (1 + erf(x/√2))/2 + x·φ(x), φ the standard normal density.
    fn slope<T: Real>(self, x: T) -> T {
        match self {
            Activation::Relu => {
                if x >= T::zero() {
                    T::one()
                } else {
                    T::zero()
                }
            }
            Activation::Gelu => {
                let half: T = real(0.5);
                let erf = (x * real(std::f64::consts::FRAC_1_SQRT_2)).erf_fast();
                let inv_sqrt_2pi: T =
                    real(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
                half * (T::one() + erf) + x * inv_sqrt_2pi * (-half * x * x).exp()
            }
        }
    }
}

/// x → activation(x).
struct Pointwise(Activation);

impl CustomOp1 for Pointwise {
    fn name(&self) -> &'static str {
        match self.0 {
            Activation::Relu => "nanhunt-relu",
            Activation::Gelu => "nanhunt-gelu",
        }
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_real!(s, T => {
            let y: Vec<T> = slice::<T>(s, l)?.iter().map(|&v| self.0.value(v)).collect();
            Ok((T::to_cpu_storage_owned(y), l.shape().clone()))
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let op = PointwiseGrad(self.0);
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// (x, grad) → grad · activation'(x).
struct PointwiseGrad(Activation);

impl CustomOp2 for PointwiseGrad {
    fn name(&self) -> &'static str {
        match self.0 {
            Activation::Relu => "nanhunt-relu-grad",
            Activation::Gelu => "nanhunt-gelu-grad",
        }
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
                .map(|(&x, &g)| g * self.0.slope(x))
                .collect();
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}
