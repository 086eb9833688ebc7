//! RMS normalization over the last dimension with its weight (Llama's
//! norm), forward and backward each one pass over the rows. candle-nn's own
//! `rms_norm` has no backward pass at all.

use super::reference;
use super::{flat, fused_for, lane_sum, last_dim, real, slice, unpack, wide, with_real, Real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// `x / sqrt(mean(x²) + eps) · w` over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::rms_norm(x, w, eps);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, RmsNorm { eps })
}

struct RmsNorm {
    eps: f64,
}

/// A row's 1/sqrt(mean(x²) + eps).
#[inline(always)]
fn rstd<T: Real>(row: &[T], eps: f64) -> T {
    let n: T = real(row.len() as f64);
    let ms = lane_sum(row.len(), |i| row[i] * row[i]) / n;
    T::one() / (ms + real(eps)).sqrt()
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "nanhunt-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1, "rms_norm")?;
        with_real!(s1, T => {
            let (x, w) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let y = wide(#[inline(always)] || {
                let mut y = vec![T::zero(); x.len()];
                let w = &w[..d];
                for (row, out) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
                    let r = rstd(row, self.eps);
                    for i in 0..d {
                        out[i] = row[i] * r * w[i];
                    }
                }
                y
            });
            Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let packed = x.apply_op3_no_bwd(w, &grad, &RmsNormGrad { eps: self.eps })?;
        let [dx, dw] = unpack(&packed, [x.shape(), w.shape()])?;
        Ok((Some(dx), Some(dw)))
    }
}

/// (x, w, grad) → [dx | dw], packed flat.
struct RmsNormGrad {
    eps: f64,
}

impl RmsNormGrad {
    #[inline(always)] // into `wide`'s AVX2 build
    fn compute<T: Real>(&self, x: &[T], w: &[T], g: &[T], d: usize) -> Vec<T> {
        let n: T = real(d as f64);
        let mut out = vec![T::zero(); x.len() + d];
        let (dx, dw) = out.split_at_mut(x.len());
        for ((row, grow), dxrow) in x
            .chunks_exact(d)
            .zip(g.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
        {
            let r = rstd(row, self.eps);
            // With x̂ = x·r and ĝ = g·w: dx = r · (ĝ - x̂ · mean(ĝ·x̂)).
            let (row, grow, w) = (&row[..d], &grow[..d], &w[..d]);
            let mean_gx = lane_sum(d, |i| grow[i] * w[i] * row[i] * r) / n;
            for i in 0..d {
                let xhat = row[i] * r;
                dw[i] += grow[i] * xhat;
                dxrow[i] = r * (grow[i] * w[i] - xhat * mean_gx);
            }
        }
        out
    }
}

impl CustomOp3 for RmsNormGrad {
    fn name(&self) -> &'static str {
        "nanhunt-rms-norm-grad"
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
        let d = last_dim(l1, "rms_norm")?;
        with_real!(s1, T => {
            let (x, w, g) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
            flat(wide(#[inline(always)] || self.compute::<T>(x, w, g, d)))
        })
    }
}
