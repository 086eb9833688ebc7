//! ReLU as one op each way. candle's backward pass builds a comparison
//! mask, converts it to floats and multiplies (three passes and two
//! buffers); here it is one pass. The semantics are candle's, kept so that
//! the fused and reference paths agree on NaNs: relu(NaN) = 0, and the
//! gradient is 1 where x ≥ 0.

use super::{fused_for, slice, with_real};
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
