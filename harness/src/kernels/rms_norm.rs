//! RMS normalization over the last dimension with its weight (Llama's
//! norm), forward and backward each one pass over the rows. candle-nn's own
//! `rms_norm` has no backward pass at all.

use super::kept::KeptRows;
use super::reference;
use super::{flat, fused_for, lane_sum, last_dim, real, slice, unpack, wide, with_real, Real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// `x / sqrt(mean(x²) + eps) · w` over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::rms_norm(x, w, eps);
    }
    let op = RmsNorm {
        eps,
        rstd: KeptRows::default(),
    };
    x.contiguous()?.apply_op2(&w.contiguous()?, op)
}

struct RmsNorm {
    eps: f64,
    /// Each row's 1/rms, for the backward, which recomputed it (one of
    /// its three passes over a row).
    rstd: KeptRows,
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
            let (y, kept) = wide(#[inline(always)] || {
                let mut y = vec![T::zero(); x.len()];
                let mut kept = Vec::with_capacity(x.len() / d);
                let w = &w[..d];
                for (row, out) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
                    let r = rstd(row, self.eps);
                    kept.push(r);
                    for i in 0..d {
                        out[i] = row[i] * r * w[i];
                    }
                }
                (y, kept)
            });
            self.rstd.keep(kept);
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
        let op = RmsNormGrad {
            eps: self.eps,
            rstd: Some(&self.rstd),
        };
        let packed = x.apply_op3_no_bwd(w, &grad, &op)?;
        let [dx, dw] = unpack(&packed, [x.shape(), w.shape()])?;
        Ok((Some(dx), Some(dw)))
    }
}

/// (x, w, grad) → [dx | dw], packed flat.
struct RmsNormGrad<'a> {
    eps: f64,
    /// The forward's 1/rms per row, where it kept them.
    rstd: Option<&'a KeptRows>,
}

impl RmsNormGrad<'_> {
    #[inline(always)] // into `wide`'s AVX2 build
    fn compute<T: Real>(&self, x: &[T], w: &[T], g: &[T], d: usize) -> Vec<T> {
        let n: T = real(d as f64);
        let kept = self.rstd.and_then(|k| k.get::<T>(x.len() / d));
        let mut out = vec![T::zero(); x.len() + d];
        let (dx, dw) = out.split_at_mut(x.len());
        for (i_row, ((row, grow), dxrow)) in x
            .chunks_exact(d)
            .zip(g.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
            .enumerate()
        {
            let r = match kept {
                Some(kept) => kept[i_row],
                None => rstd(row, self.eps),
            };
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

impl CustomOp3 for RmsNormGrad<'_> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The backward gives the same bits reading the forward's 1/rms as
    /// computing it again.
    #[test]
    fn the_kept_rstd_gives_the_recomputed_bits() {
        let mut rng = crate::rng::Rng::new(8);
        for d in [1, 13, 64] {
            let (x, w, g) = super::super::kept::norm_case(&mut rng, d);
            let kept = KeptRows::default();
            kept.keep::<f32>(x.chunks(d).map(|row| rstd(row, 1e-6)).collect());
            let [again, read] = [None, Some(&kept)].map(|rstd| {
                let op = RmsNormGrad { eps: 1e-6, rstd };
                op.compute(&x, &w, &g, d)
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            });
            assert_eq!(again, read, "d = {d}");
        }
    }
}
