//! 2×2, stride-2 max and average pooling (odd edges dropped, as PyTorch
//! does) with index-based backward passes: the max-pool gradient goes to
//! the first maximum of each window, found again from the input.

use super::reference;
use super::{fused_for, real, slice, with_real, Real};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    Max,
    Avg,
}

/// (B, C, H, W) → (B, C, H/2, W/2).
pub fn pool2x2(x: &Tensor, kind: PoolKind) -> Result<Tensor> {
    if !fused_for(x) {
        return match kind {
            PoolKind::Max => reference::max_pool2x2(x),
            PoolKind::Avg => reference::avg_pool2x2(x),
        };
    }
    x.contiguous()?.apply_op1(Pool { kind })
}

struct Pool {
    kind: PoolKind,
}

fn dims(l: &Layout) -> Result<(usize, usize, usize)> {
    match *l.dims() {
        [b, c, h, w] => Ok((b * c, h, w)),
        ref other => candle_core::bail!("pool2x2: input must be 4-D, got {other:?}"),
    }
}

/// The index (0..4, row-major) of the first maximum of a 2×2 window; a
/// NaN counts as the maximum (the first NaN), so it propagates, as in
/// PyTorch. Comparisons become index arithmetic rather than branches: on
/// real activations they are unpredictable, and mispredictions were most
/// of the op's time. The NaN branch is almost never taken.
#[inline]
fn argmax4<T: Real>(v: [T; 4]) -> usize {
    let [a, b, c, d] = v;
    if a.is_nan() || b.is_nan() || c.is_nan() || d.is_nan() {
        return v.iter().position(|x| x.is_nan()).unwrap_or(0);
    }
    let top = usize::from(b > a);
    let bottom = 2 + usize::from(d > c);
    let use_bottom = usize::from(v[bottom] > v[top]);
    top + use_bottom * (bottom - top)
}

/// Calls `f(i, j, [a, b, c, d])` for every window of an (H, W) plane; the
/// two input rows of a window row are sliced once.
#[inline]
fn windows<T: Real>(plane: &[T], h: usize, w: usize, mut f: impl FnMut(usize, usize, [T; 4])) {
    for i in 0..h / 2 {
        let top = &plane[2 * i * w..][..w];
        let bottom = &plane[(2 * i + 1) * w..][..w];
        for j in 0..w / 2 {
            f(
                i,
                j,
                [top[2 * j], top[2 * j + 1], bottom[2 * j], bottom[2 * j + 1]],
            );
        }
    }
}

impl Pool {
    fn forward<T: Real>(&self, x: &[T], (planes, h, w): (usize, usize, usize)) -> Vec<T> {
        let quarter: T = real(0.25);
        let mut y = Vec::with_capacity(planes * (h / 2) * (w / 2));
        for plane in x.chunks_exact(h * w) {
            windows(plane, h, w, |_, _, v| {
                y.push(match self.kind {
                    PoolKind::Max => v[argmax4(v)],
                    PoolKind::Avg => ((v[0] + v[1]) + (v[2] + v[3])) * quarter,
                })
            });
        }
        y
    }
}

impl CustomOp1 for Pool {
    fn name(&self) -> &'static str {
        "nanhunt-pool2x2"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (planes, h, w) = dims(l)?;
        let mut out = l.dims().to_vec();
        out[2] = h / 2;
        out[3] = w / 2;
        with_real!(s, T => {
            let y = self.forward::<T>(slice(s, l)?, (planes, h, w));
            Ok((T::to_cpu_storage_owned(y), Shape::from(out)))
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        Ok(Some(
            x.apply_op2_no_bwd(&grad, &PoolGrad { kind: self.kind })?,
        ))
    }
}

/// (x, grad of the pooled output) → grad of x.
struct PoolGrad {
    kind: PoolKind,
}

impl PoolGrad {
    fn compute<T: Real>(&self, x: &[T], g: &[T], (planes, h, w): (usize, usize, usize)) -> Vec<T> {
        let (h2, w2) = (h / 2, w / 2);
        let quarter: T = real(0.25);
        let mut dx = vec![T::zero(); planes * h * w];
        for ((plane, gp), dp) in x
            .chunks_exact(h * w)
            .zip(g.chunks_exact(h2 * w2))
            .zip(dx.chunks_exact_mut(h * w))
        {
            windows(plane, h, w, |i, j, v| {
                let gij = gp[i * w2 + j];
                let at = [
                    2 * i * w + 2 * j,
                    2 * i * w + 2 * j + 1,
                    (2 * i + 1) * w + 2 * j,
                    (2 * i + 1) * w + 2 * j + 1,
                ];
                match self.kind {
                    PoolKind::Max => dp[at[argmax4(v)]] = gij,
                    PoolKind::Avg => at.iter().for_each(|&a| dp[a] = gij * quarter),
                }
            });
        }
        dx
    }
}

impl CustomOp2 for PoolGrad {
    fn name(&self) -> &'static str {
        "nanhunt-pool2x2-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = dims(l1)?;
        with_real!(s1, T => {
            let dx = self.compute::<T>(slice(s1, l1)?, slice(s2, l2)?, d);
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}
