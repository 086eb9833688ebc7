//! SwiGLU's gate, silu(a)·b, as one op each way. candle computes it as a
//! silu and a product forward, and silu's backward as a chain of
//! element-wise ops that recompute the sigmoid.

use super::reference;
use super::{flat, fused_for, slice, unpack, widest, with_real, Real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// silu(a)·b element-wise (a and b of one shape).
pub fn swiglu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !fused_for(a) || a.shape() != b.shape() {
        return reference::swiglu(a, b);
    }
    a.contiguous()?.apply_op2(&b.contiguous()?, SwiGlu)
}

struct SwiGlu;

/// σ(x) = 1 / (1 + e^-x), with the kernels' fast exp.
#[inline(always)]
fn sigmoid<T: Real>(x: T) -> T {
    T::one() / (T::one() + (-x).exp_fast())
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "nanhunt-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_real!(s1, T => {
            let (a, b) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            // An index loop, not `collect`: the iterator's fold is a function
            // of its own, compiled without `widest`'s vectors (a quarter of the
            // decoder's MLP forward).
            let y = widest(#[inline(always)] || {
                let mut y = vec![T::zero(); a.len()];
                for i in 0..y.len() {
                    y[i] = a[i] * sigmoid(a[i]) * b[i];
                }
                y
            });
            Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let packed = a.apply_op3_no_bwd(b, &grad.contiguous()?, &SwiGluGrad)?;
        let [da, db] = unpack(&packed, [a.shape(), b.shape()])?;
        Ok((Some(da), Some(db)))
    }
}

/// (a, b, grad) → [da | db]: da = g·b·σ(a)·(1 + a·(1 - σ(a))), db = g·silu(a).
struct SwiGluGrad;

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        "nanhunt-swiglu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_real!(s1, T => {
            let (a, b, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            flat(widest(#[inline(always)] || {
                let n = a.len();
                let mut out = vec![T::zero(); 2 * n];
                let (da, db) = out.split_at_mut(n);
                for i in 0..n {
                    let s = sigmoid(a[i]);
                    da[i] = g[i] * b[i] * s * (T::one() + a[i] * (T::one() - s));
                    db[i] = g[i] * a[i] * s;
                }
                out
            }))
        })
    }
}
