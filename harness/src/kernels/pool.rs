//! 2×2, stride-2 max and average pooling (odd edges dropped, as PyTorch
//! does) with index-based backward passes: the max-pool gradient goes to
//! the first maximum of each window, whose index the forward pass keeps.
//!
//! A CNN block's ReLU or GELU followed by max pooling can run as one op
//! (`relu_max_pool2x2`, `gelu_max_pool2x2`): the activated tensor, as big
//! as the convolution's output, is then never stored, nor is its gradient
//! (which candle would zero-fill and add into). Values and gradients are
//! the same bits as the two ops in turn: the same scalar code per element.

use super::activation::{Activation, Gelu, Identity, Relu};
use super::reference;
use super::{fused_for, real, slice, widest, with_real, Real};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

/// Which 2×2 pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Max pooling.
    Max,
    /// Average pooling.
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
    pool_op(x, kind, Identity)
}

/// max_pool2x2(relu(x)) as one op.
pub fn relu_max_pool2x2(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::max_pool2x2(&reference::relu(x)?);
    }
    pool_op(x, PoolKind::Max, Relu)
}

/// max_pool2x2(gelu(x)) as one op.
pub fn gelu_max_pool2x2(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::max_pool2x2(&x.gelu_erf()?);
    }
    pool_op(x, PoolKind::Max, Gelu)
}

fn pool_op<A: Activation>(x: &Tensor, kind: PoolKind, _: A) -> Result<Tensor> {
    x.contiguous()?.apply_op1(Pool::<A> {
        kind,
        act: PhantomData,
        argmax: Arc::default(),
    })
}

/// Pooling of the activated input.
struct Pool<A> {
    kind: PoolKind,
    act: PhantomData<A>,
    /// Max pooling: the index (0..4) of each window's maximum, for the
    /// backward pass.
    argmax: Arc<OnceLock<Vec<u8>>>,
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

impl<A: Activation> Pool<A> {
    #[inline(always)] // into `widest`'s build
    fn forward<T: Real>(&self, x: &[T], (planes, h, w): (usize, usize, usize)) -> Vec<T> {
        let act = |[a, b, c, d]: [T; 4]| [A::value(a), A::value(b), A::value(c), A::value(d)];
        let (h2, w2) = (h / 2, w / 2);
        let mut y = vec![T::zero(); planes * h2 * w2];
        if self.kind == PoolKind::Avg {
            let quarter: T = real(0.25);
            for (plane, yp) in x.chunks_exact(h * w).zip(y.chunks_exact_mut(h2 * w2)) {
                windows(plane, h, w, |i, j, v| {
                    let v = act(v);
                    yp[i * w2 + j] = ((v[0] + v[1]) + (v[2] + v[3])) * quarter
                });
            }
            return y;
        }
        let mut argmax = vec![0u8; planes * h2 * w2];
        let planes = x
            .chunks_exact(h * w)
            .zip(y.chunks_exact_mut(h2 * w2))
            .zip(argmax.chunks_exact_mut(h2 * w2));
        for ((plane, yp), ip) in planes {
            // `argmax4` as selects, so that the window loop vectorizes; it
            // agrees with `argmax4` except where a window holds a NaN, and
            // a plane with one is redone through `argmax4`.
            let mut nan = false;
            for i in 0..h2 {
                let top = &plane[2 * i * w..][..2 * w2];
                let bottom = &plane[(2 * i + 1) * w..][..2 * w2];
                let (yr, ir) = (&mut yp[i * w2..][..w2], &mut ip[i * w2..][..w2]);
                for j in 0..w2 {
                    let [a, b, c, d] =
                        act([top[2 * j], top[2 * j + 1], bottom[2 * j], bottom[2 * j + 1]]);
                    let (right_top, right_bottom) = (b > a, d > c);
                    let t = if right_top { b } else { a };
                    let u = if right_bottom { d } else { c };
                    let use_bottom = u > t;
                    yr[j] = if use_bottom { u } else { t };
                    ir[j] = if use_bottom {
                        2 + u8::from(right_bottom)
                    } else {
                        u8::from(right_top)
                    };
                    nan |= a.is_nan() | b.is_nan() | c.is_nan() | d.is_nan();
                }
            }
            if nan {
                windows(plane, h, w, |i, j, v| {
                    let v = act(v);
                    let k = argmax4(v);
                    yp[i * w2 + j] = v[k];
                    ip[i * w2 + j] = k as u8;
                });
            }
        }
        // A fresh op per call: the cell is empty here.
        let _ = self.argmax.set(argmax);
        y
    }
}

impl<A: Activation> CustomOp1 for Pool<A> {
    fn name(&self) -> &'static str {
        "nanhunt-pool2x2"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (planes, h, w) = dims(l)?;
        let mut out = l.dims().to_vec();
        out[2] = h / 2;
        out[3] = w / 2;
        with_real!(s, T => {
            let x = slice(s, l)?;
            let y = widest(#[inline(always)] || self.forward::<T>(x, (planes, h, w)));
            Ok((T::to_cpu_storage_owned(y), Shape::from(out)))
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        let grad_op = PoolGrad::<A> {
            kind: self.kind,
            act: PhantomData,
            argmax: self.argmax.clone(),
        };
        Ok(Some(x.apply_op2_no_bwd(&grad, &grad_op)?))
    }
}

/// (x, grad of the pooled output) and the forward's window maxima → grad
/// of x: the pooling's gradient times the activation's slope, as the two
/// ops' backward passes in turn compute it.
struct PoolGrad<A> {
    kind: PoolKind,
    act: PhantomData<A>,
    argmax: Arc<OnceLock<Vec<u8>>>,
}

impl<A: Activation> PoolGrad<A> {
    #[inline(always)] // into `widest`'s build
    fn compute<T: Real>(
        &self,
        x: &[T],
        g: &[T],
        (planes, h, w): (usize, usize, usize),
    ) -> Result<Vec<T>> {
        let (h2, w2) = (h / 2, w / 2);
        let quarter: T = real(0.25);
        let zero = T::zero();
        // Zeros stay where no window reaches (an odd last row or column).
        let mut dx = vec![zero; planes * h * w];
        let argmax = match self.kind {
            PoolKind::Max => match self.argmax.get() {
                Some(a) => &a[..],
                None => candle_core::bail!("pool2x2: backward before forward"),
            },
            PoolKind::Avg => &[],
        };
        let planes = g
            .chunks_exact(h2 * w2)
            .zip(x.chunks_exact(h * w))
            .zip(dx.chunks_exact_mut(h * w));
        for (p, ((gp, xp), dp)) in planes.enumerate() {
            for i in 0..h2 {
                let gr = &gp[i * w2..][..w2];
                let (top, bottom) = dp[2 * i * w..(2 * i + 2) * w].split_at_mut(w);
                let (top, bottom) = (&mut top[..2 * w2], &mut bottom[..2 * w2]);
                if self.kind == PoolKind::Avg {
                    for j in 0..w2 {
                        let v = gr[j] * quarter;
                        (top[2 * j], top[2 * j + 1]) = (v, v);
                        (bottom[2 * j], bottom[2 * j + 1]) = (v, v);
                    }
                    continue;
                }
                let ir = &argmax[(p * h2 + i) * w2..][..w2];
                for j in 0..w2 {
                    let (k, v) = (ir[j], gr[j]);
                    top[2 * j] = if k == 0 { v } else { zero };
                    top[2 * j + 1] = if k == 1 { v } else { zero };
                    bottom[2 * j] = if k == 2 { v } else { zero };
                    bottom[2 * j + 1] = if k == 3 { v } else { zero };
                }
            }
            // Then the activation's backward over the whole plane, while it
            // is in cache: one contiguous loop (nothing for `Identity`,
            // whose slope is 1).
            for (d, &xv) in dp.iter_mut().zip(xp) {
                *d *= A::slope(xv);
            }
        }
        Ok(dx)
    }
}

impl<A: Activation> CustomOp2 for PoolGrad<A> {
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
            let (x, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let dx = widest(#[inline(always)] || self.compute::<T>(x, g, d))?;
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}
