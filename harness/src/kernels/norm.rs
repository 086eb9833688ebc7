//! Layer normalization over the last dimension with its affine weight and
//! bias, forward and backward each one pass over the rows.

use super::kept::KeptRows;
use super::reference;
use super::{
    flat, fused_for, lane_sum, lane_sum2, last_dim, real, slice, unpack, wide, with_real, Real,
};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// `(x - mean) / sqrt(var + eps) · w + b` over the last dimension.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::layer_norm(x, w, b, eps);
    }
    let op = LayerNorm {
        eps,
        moments: KeptRows::default(),
    };
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, op)
}

struct LayerNorm {
    eps: f64,
    /// Each row's (mean, rstd), for the backward, which recomputed them
    /// (two of its four passes over a row).
    moments: KeptRows,
}

/// A row's mean and 1/sqrt(var + eps).
#[inline(always)]
fn moments<T: Real>(row: &[T], eps: f64) -> (T, T) {
    let n: T = real(row.len() as f64);
    let mean = lane_sum(row.len(), |i| row[i]) / n;
    let var = lane_sum(row.len(), |i| (row[i] - mean) * (row[i] - mean)) / n;
    let eps: T = real(eps);
    (mean, T::one() / (var + eps).sqrt())
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "nanhunt-layer-norm"
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
        let d = last_dim(l1, "layer_norm")?;
        with_real!(s1, T => {
            let (x, w, b) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let (y, kept) = wide(#[inline(always)] || {
                let mut y = vec![T::zero(); x.len()];
                let mut kept = Vec::with_capacity(x.len() / d);
                let (w, b) = (&w[..d], &b[..d]);
                for (row, out) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
                    let (mean, rstd) = moments(row, self.eps);
                    kept.push((mean, rstd));
                    for i in 0..d {
                        out[i] = (row[i] - mean) * rstd * w[i] + b[i];
                    }
                }
                (y, kept)
            });
            self.moments.keep(kept);
            Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let op = LayerNormGrad {
            eps: self.eps,
            moments: Some(&self.moments),
        };
        let packed = x.apply_op3_no_bwd(w, &grad, &op)?;
        let [dx, dw, db] = unpack(&packed, [x.shape(), w.shape(), b.shape()])?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// (x, w, grad) → [dx | dw | db], packed flat.
struct LayerNormGrad<'a> {
    eps: f64,
    /// The forward's (mean, rstd) per row, where it kept them.
    moments: Option<&'a KeptRows>,
}

impl LayerNormGrad<'_> {
    #[inline(always)] // into `wide`'s AVX2 build
    fn compute<T: Real>(&self, x: &[T], w: &[T], g: &[T], d: usize) -> Vec<T> {
        let n: T = real(d as f64);
        let kept = self.moments.and_then(|m| m.get::<(T, T)>(x.len() / d));
        let mut out = vec![T::zero(); x.len() + 2 * d];
        let (dx, dwb) = out.split_at_mut(x.len());
        let (dw, db) = dwb.split_at_mut(d);
        for (r, ((row, grow), dxrow)) in x
            .chunks_exact(d)
            .zip(g.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
            .enumerate()
        {
            let (mean, rstd) = match kept {
                Some(kept) => kept[r],
                None => moments(row, self.eps),
            };
            // With x̂ = (x - mean)·rstd and ĝ = g·w:
            // dx = rstd · (ĝ - mean(ĝ) - x̂ · mean(ĝ·x̂)).
            let (row, grow, w) = (&row[..d], &grow[..d], &w[..d]);
            let (dw, db, dxrow) = (&mut dw[..d], &mut db[..d], &mut dxrow[..d]);
            // Both sums in one pass and every output in a second (each
            // value's operations as before, so its bits).
            let (sum_g, sum_gx) = lane_sum2(d, |i| {
                let gw = grow[i] * w[i];
                (gw, gw * ((row[i] - mean) * rstd))
            });
            let (mean_g, mean_gx) = (sum_g / n, sum_gx / n);
            for i in 0..d {
                let xhat = (row[i] - mean) * rstd;
                dw[i] += grow[i] * xhat;
                db[i] += grow[i];
                dxrow[i] = rstd * (grow[i] * w[i] - mean_g - xhat * mean_gx);
            }
        }
        out
    }
}

impl CustomOp3 for LayerNormGrad<'_> {
    fn name(&self) -> &'static str {
        "nanhunt-layer-norm-grad"
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
        let d = last_dim(l1, "layer_norm")?;
        with_real!(s1, T => {
            let (x, w, g) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
            flat(wide(#[inline(always)] || self.compute::<T>(x, w, g, d)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backward as it was computed before its passes were merged: a
    /// pass per sum, one for the weight's and bias's gradients, one for
    /// the input's.
    fn pass_per_quantity(x: &[f32], w: &[f32], g: &[f32], d: usize, eps: f64) -> Vec<f32> {
        let n = d as f32;
        let mut out = vec![0f32; x.len() + 2 * d];
        let (dx, dwb) = out.split_at_mut(x.len());
        let (dw, db) = dwb.split_at_mut(d);
        for ((row, grow), dxrow) in x.chunks(d).zip(g.chunks(d)).zip(dx.chunks_mut(d)) {
            let (mean, rstd) = moments(row, eps);
            let sum_g = lane_sum(d, |i| grow[i] * w[i]);
            let sum_gx = lane_sum(d, |i| grow[i] * w[i] * ((row[i] - mean) * rstd));
            for i in 0..d {
                let xhat = (row[i] - mean) * rstd;
                dw[i] += grow[i] * xhat;
                db[i] += grow[i];
            }
            let (mean_g, mean_gx) = (sum_g / n, sum_gx / n);
            for i in 0..d {
                let xhat = (row[i] - mean) * rstd;
                dxrow[i] = rstd * (grow[i] * w[i] - mean_g - xhat * mean_gx);
            }
        }
        out
    }

    #[test]
    fn the_merged_backward_passes_keep_every_bit() {
        let mut rng = crate::rng::Rng::new(7);
        for d in [1, 13, 64] {
            let (x, w, g) = super::super::kept::norm_case(&mut rng, d);
            let before = pass_per_quantity(&x, &w, &g, d, 1e-5);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            // Recomputing the rows' moments, and reading the forward's.
            let kept = KeptRows::default();
            kept.keep::<(f32, f32)>(x.chunks(d).map(|row| moments(row, 1e-5)).collect());
            for moments in [None, Some(&kept)] {
                let op = LayerNormGrad { eps: 1e-5, moments };
                let merged = op.compute(&x, &w, &g, d);
                assert_eq!(bits(&merged), bits(&before), "d = {d}");
            }
        }
    }
}
