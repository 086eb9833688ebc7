//! Softmax over the last dimension (the row maximum subtracted), with the
//! backward pass `dx = y · (g - Σ g·y)` as one op.

use super::reference;
use super::{fused_for, lane_sum, slice, with_real, Real};
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

fn softmax_rows<T: Real>(x: &[T], d: usize) -> Vec<T> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks_exact(d) {
        // NaN-ignoring max; a NaN, ±inf or all -inf row still ends up NaN
        // through `x - max`, as in the reference.
        let max = row
            .iter()
            .copied()
            .fold(T::neg_infinity(), num_traits::Float::max);
        let start = y.len();
        y.extend(row.iter().map(|&v| (v - max).exp()));
        let e = &y[start..];
        let sum = lane_sum(e.len(), |i| e[i]);
        y[start..].iter_mut().for_each(|v| *v /= sum);
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
            let y = softmax_rows::<T>(slice(s, l)?, d);
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
            let mut dx = Vec::with_capacity(y.len());
            for (yr, gr) in y.chunks_exact(d).zip(g.chunks_exact(d)) {
                let dot = lane_sum(d, |i| yr[i] * gr[i]);
                dx.extend(yr.iter().zip(gr).map(|(&a, &b)| a * (b - dot)));
            }
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}
