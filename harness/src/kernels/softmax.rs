//! Softmax over the last dimension (the row maximum subtracted), with the
//! backward pass `dx = y · (g - Σ g·y)` as one op.

use super::reference;
use super::{fused_for, lane_sum, slice, wide, with_real, Real};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};

pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::softmax(x);
    }
    x.contiguous()?.apply_op1(Softmax)
}

fn last_dim(l: &Layout) -> Result<usize> {
    match l.dims().last() {
        Some(&d) if d > 0 => Ok(d),
        _ => candle_core::bail!("softmax: input needs a non-empty last dimension"),
    }
}

struct Softmax;

#[inline(always)] // into `wide`'s AVX2 build
fn softmax_rows<T: Real>(x: &[T], d: usize) -> Vec<T> {
    let mut y = vec![T::zero(); x.len()];
    for (row, out) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
        // NaN-ignoring max; a NaN, ±inf or all -inf row still ends up NaN
        // through `x - max`, as in the reference.
        let mut max = T::neg_infinity();
        for &v in row {
            max = num_traits::Float::max(max, v);
        }
        for i in 0..d {
            out[i] = (row[i] - max).exp_fast();
        }
        let sum = lane_sum(d, |i| out[i]);
        for v in out.iter_mut() {
            *v /= sum;
        }
    }
    y
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "nanhunt-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l)?;
        with_real!(s, T => {
            let x = slice(s, l)?;
            let y = wide(#[inline(always)] || softmax_rows::<T>(x, d));
            Ok((T::to_cpu_storage_owned(y), l.shape().clone()))
        })
    }

    fn bwd(&self, _x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        Ok(Some(res.apply_op2_no_bwd(&grad, &SoftmaxGrad)?))
    }
}

/// (y, grad) → dx.
struct SoftmaxGrad;

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "nanhunt-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1)?;
        with_real!(s1, T => {
            let (y, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let dx = wide(#[inline(always)] || {
                let mut dx = vec![T::zero(); y.len()];
                let rows = y.chunks_exact(d).zip(g.chunks_exact(d)).zip(dx.chunks_exact_mut(d));
                for ((yr, gr), out) in rows {
                    let dot = lane_sum(d, |i| yr[i] * gr[i]);
                    for i in 0..d {
                        out[i] = yr[i] * (gr[i] - dot);
                    }
                }
                dx
            });
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}
