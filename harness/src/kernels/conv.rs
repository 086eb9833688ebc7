//! Same-padded, stride-1 2-D convolution with its bias, as im2col + one
//! matrix product per sample. The backward pass computes the weight and
//! bias gradients in one fused op (im2col again, then a product) and the
//! input gradient (a product, then col2im) only when the input needs one:
//! the first layer's input is data, and its gradient is never used.

use super::gemm::{matmul, Mat};
use super::reference;
use super::{flat, fused_for, lane_sum, slice, unpack, with_real, Real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// `x (B, C, H, W) ⊛ w (O, C, k, k) + b (O)` with padding k/2 and stride 1.
pub fn conv2d(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::conv2d(x, w, b);
    }
    let (.., k, _) = w.dims4()?;
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, Conv { k, pad: k / 2 })
}

/// The geometry of one convolution.
#[derive(Clone, Copy)]
struct Geometry {
    c: usize,
    h: usize,
    w: usize,
    k: usize,
    pad: usize,
    ho: usize,
    wo: usize,
}

impl Geometry {
    fn new(c: usize, h: usize, w: usize, k: usize, pad: usize) -> Result<Self> {
        let out = |n: usize| (n + 2 * pad + 1).checked_sub(k).filter(|&o| o > 0);
        match (out(h), out(w)) {
            (Some(ho), Some(wo)) => Ok(Geometry {
                c,
                h,
                w,
                k,
                pad,
                ho,
                wo,
            }),
            _ => candle_core::bail!("conv2d: kernel {k} does not fit a {h}×{w} input"),
        }
    }

    /// Rows of the column matrix: C·k·k.
    fn patch(&self) -> usize {
        self.c * self.k * self.k
    }

    fn out_pixels(&self) -> usize {
        self.ho * self.wo
    }

    /// The output columns `ow` whose input column `ow + kj - pad` lies
    /// inside the image: `lo..hi`.
    fn valid_cols(&self, kj: usize) -> (usize, usize) {
        let lo = self.pad.saturating_sub(kj).min(self.wo);
        let hi = (self.w + self.pad).saturating_sub(kj).min(self.wo).max(lo);
        (lo, hi)
    }

    /// The input row of output row `oh` under kernel row `ki`, if inside.
    fn input_row(&self, oh: usize, ki: usize) -> Option<usize> {
        (oh + ki).checked_sub(self.pad).filter(|&ih| ih < self.h)
    }

    /// Fills `cols` (C·k·k × Ho·Wo) with the patches of one image (C, H, W).
    fn im2col<T: Real>(&self, x: &[T], cols: &mut [T]) {
        let (k, wo, n) = (self.k, self.wo, self.out_pixels());
        for c in 0..self.c {
            for ki in 0..k {
                for kj in 0..k {
                    let row = &mut cols[((c * k + ki) * k + kj) * n..][..n];
                    let (lo, hi) = self.valid_cols(kj);
                    for oh in 0..self.ho {
                        let out = &mut row[oh * wo..(oh + 1) * wo];
                        let Some(ih) = self.input_row(oh, ki) else {
                            out.fill(T::zero());
                            continue;
                        };
                        out[..lo].fill(T::zero());
                        out[hi..].fill(T::zero());
                        let src = &x[(c * self.h + ih) * self.w..][..self.w];
                        // input column = ow + kj - pad, in range for lo..hi
                        out[lo..hi].copy_from_slice(&src[lo + kj - self.pad..hi + kj - self.pad]);
                    }
                }
            }
        }
    }

    /// Adds the columns back into one image's gradient (the adjoint of im2col).
    fn col2im<T: Real>(&self, cols: &[T], dx: &mut [T]) {
        let (k, wo, n) = (self.k, self.wo, self.out_pixels());
        for c in 0..self.c {
            for ki in 0..k {
                for kj in 0..k {
                    let row = &cols[((c * k + ki) * k + kj) * n..][..n];
                    let (lo, hi) = self.valid_cols(kj);
                    for oh in 0..self.ho {
                        let Some(ih) = self.input_row(oh, ki) else {
                            continue;
                        };
                        let src = &row[oh * wo + lo..oh * wo + hi];
                        let dst = &mut dx[(c * self.h + ih) * self.w..][..self.w];
                        let dst = &mut dst[lo + kj - self.pad..hi + kj - self.pad];
                        dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s);
                    }
                }
            }
        }
    }
}

fn dims4(l: &Layout, what: &str) -> Result<(usize, usize, usize, usize)> {
    match *l.dims() {
        [a, b, c, d] => Ok((a, b, c, d)),
        ref other => candle_core::bail!("conv2d: {what} must be 4-D, got {other:?}"),
    }
}

struct Conv {
    k: usize,
    pad: usize,
}

impl Conv {
    fn forward<T: Real>(
        &self,
        x: &[T],
        lx: &Layout,
        w: &[T],
        bias: &[T],
    ) -> Result<(Vec<T>, Shape)> {
        let (batch, c, h, wd) = dims4(lx, "input")?;
        let g = Geometry::new(c, h, wd, self.k, self.pad)?;
        let (patch, n, o) = (g.patch(), g.out_pixels(), bias.len());
        if w.len() != o * patch {
            candle_core::bail!(
                "conv2d: weight has {} elements, expected {o}×{patch}",
                w.len()
            );
        }
        let mut cols = vec![T::zero(); patch * n];
        let mut y = vec![T::zero(); batch * o * n];
        for (xb, yb) in x.chunks_exact(c * h * wd).zip(y.chunks_exact_mut(o * n)) {
            g.im2col(xb, &mut cols);
            for (row, &bo) in yb.chunks_exact_mut(n).zip(bias) {
                row.fill(bo);
            }
            matmul(
                (o, n, patch),
                Mat::rows(w, patch),
                Mat::rows(&cols, n),
                yb,
                true,
            );
        }
        Ok((y, Shape::from((batch, o, g.ho, g.wo))))
    }
}

impl CustomOp3 for Conv {
    fn name(&self) -> &'static str {
        "nanhunt-conv2d"
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
            let (y, shape) = self.forward::<T>(slice(s1, l1)?, l1, slice(s2, l2)?, slice(s3, l3)?)?;
            Ok((T::to_cpu_storage_owned(y), shape))
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
        let dx = if x.track_op() {
            let (_, _, h, wd) = x.dims4()?;
            Some(grad.apply_op2_no_bwd(
                w,
                &InputGrad {
                    k: self.k,
                    pad: self.pad,
                    h,
                    w: wd,
                },
            )?)
        } else {
            None
        };
        let (dw, db) = if w.track_op() || b.track_op() {
            let packed = x.apply_op2_no_bwd(
                &grad,
                &ParamGrad {
                    k: self.k,
                    pad: self.pad,
                },
            )?;
            let [dw, db] = unpack(&packed, [w.shape(), b.shape()])?;
            (Some(dw), Some(db))
        } else {
            (None, None)
        };
        Ok((dx, dw, db))
    }
}

/// (x, grad) → [dw (O·C·k·k) | db (O)], packed flat.
struct ParamGrad {
    k: usize,
    pad: usize,
}

impl ParamGrad {
    fn compute<T: Real>(&self, x: &[T], lx: &Layout, grad: &[T], lg: &Layout) -> Result<Vec<T>> {
        let (_, c, h, wd) = dims4(lx, "input")?;
        let (_, o, ..) = dims4(lg, "gradient")?;
        let g = Geometry::new(c, h, wd, self.k, self.pad)?;
        let (patch, n) = (g.patch(), g.out_pixels());
        let mut cols = vec![T::zero(); patch * n];
        // dWᵀ (C·k·k × O) accumulates cols · gᵀ: the long pixel dimension is
        // the product's inner one, and the column matrix is read row-major
        // (measured faster than g · colsᵀ into dW directly).
        let mut dw_t = vec![T::zero(); patch * o];
        let mut out = vec![T::zero(); o * patch + o];
        let (dw, db) = out.split_at_mut(o * patch);
        for (xb, gb) in x.chunks_exact(c * h * wd).zip(grad.chunks_exact(o * n)) {
            g.im2col(xb, &mut cols);
            matmul(
                (patch, o, n),
                Mat::rows(&cols, n),
                Mat::transposed(gb, n),
                &mut dw_t,
                true,
            );
            for (d, row) in db.iter_mut().zip(gb.chunks_exact(n)) {
                *d += lane_sum(row.len(), |i| row[i]);
            }
        }
        for (p, row) in dw_t.chunks_exact(o).enumerate() {
            for (oi, &v) in row.iter().enumerate() {
                dw[oi * patch + p] = v;
            }
        }
        Ok(out)
    }
}

impl CustomOp2 for ParamGrad {
    fn name(&self) -> &'static str {
        "nanhunt-conv2d-param-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_real!(s1, T => {
            flat(self.compute::<T>(slice(s1, l1)?, l1, slice(s2, l2)?, l2)?)
        })
    }
}

/// (grad, w) → dx (B, C, H, W).
struct InputGrad {
    k: usize,
    pad: usize,
    h: usize,
    w: usize,
}

impl InputGrad {
    fn compute<T: Real>(
        &self,
        grad: &[T],
        lg: &Layout,
        w: &[T],
        lw: &Layout,
    ) -> Result<(Vec<T>, Shape)> {
        let (batch, o, ..) = dims4(lg, "gradient")?;
        let (_, c, ..) = dims4(lw, "weight")?;
        let g = Geometry::new(c, self.h, self.w, self.k, self.pad)?;
        let (patch, n, image) = (g.patch(), g.out_pixels(), c * self.h * self.w);
        let mut cols = vec![T::zero(); patch * n];
        let mut dx = vec![T::zero(); batch * image];
        for (gb, dxb) in grad.chunks_exact(o * n).zip(dx.chunks_exact_mut(image)) {
            matmul(
                (patch, n, o),
                Mat::transposed(w, patch),
                Mat::rows(gb, n),
                &mut cols,
                false,
            );
            g.col2im(&cols, dxb);
        }
        Ok((dx, Shape::from((batch, c, self.h, self.w))))
    }
}

impl CustomOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "nanhunt-conv2d-input-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_real!(s1, T => {
            let (dx, shape) = self.compute::<T>(slice(s1, l1)?, l1, slice(s2, l2)?, l2)?;
            Ok((T::to_cpu_storage_owned(dx), shape))
        })
    }
}
