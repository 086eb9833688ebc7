//! A whole GRU layer over the sequence as one op, forward and backward,
//! as `lstm` does for the LSTM: the input projection is one product over
//! all B·S rows, the recurrence one loop of a (B×H)·(H×3H) product and the
//! fused cell per step, and backpropagation through time one op whose
//! weight gradients are one product each over every step. The weights
//! travel joined as one (3H, in + H) tensor and the biases as one (2, 3H).
//!
//! The forward pass computes, per step, exactly what the per-step ops
//! compute (`linear` of x and of h, `xw_rz + hw_rz`, `gru_n`, `gru_h`,
//! through the same row functions), so a traced re-run, which runs the
//! per-step ops to record every step's gates and h, sees the same forward
//! bits (tested in `runner::tests`). Gates in PyTorch's (r, z, n) order.

use super::cell::{gru_h_row, gru_n_row, sigmoid};
use super::gemm::{matmul, matmul_strided, Mat};
use super::recurrent::{
    backprop_hidden, joined, project_hidden, project_inputs, unpack_grads, Grads3, Sizes,
};
use super::reference;
use super::{flat, fused_for, slice, wide, with_real, Real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};
use std::sync::{Arc, OnceLock};

/// Every hidden state (B, S, H) of a GRU layer with zero initial state,
/// from the inputs `x` (B, S, in) and PyTorch's parameters: `w_ih` (3H, in),
/// `b_ih` (3H), `w_hh` (3H, H), `b_hh` (3H).
pub fn gru_layer(
    x: &Tensor,
    w_ih: &Tensor,
    b_ih: &Tensor,
    w_hh: &Tensor,
    b_hh: &Tensor,
) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::gru_layer(x, w_ih, b_ih, w_hh, b_hh);
    }
    let (w, b) = joined(w_ih, b_ih, w_hh, b_hh)?;
    x.contiguous()?.apply_op3(
        &w,
        &b,
        GruLayer {
            saved: Arc::default(),
        },
    )
}

/// What the forward pass keeps for the backward pass, for every (b, t)
/// row: the r/z pre-activations (2H), the candidate n (H), the hidden
/// projection's n part h_n (H), and [x_t | h_{t-1}] (in + H).
struct Saved {
    rz: CpuStorage,
    n: CpuStorage,
    hn: CpuStorage,
    z: CpuStorage,
}

struct GruLayer {
    saved: Arc<OnceLock<Saved>>,
}

impl GruLayer {
    #[inline(always)] // into `wide`'s AVX2 build
    fn forward<T: Real>(&self, x: &[T], w: &[T], b: &[T], d: Sizes) -> Vec<T> {
        let Sizes {
            b: bsz,
            s: steps,
            n_in,
            h,
        } = d;
        let (h3, k, rows) = (3 * h, d.k(), bsz * steps);
        let (b_ih, b_hh) = b.split_at(h3);
        let (xw, mut z) = project_inputs(x, w, b_ih, d);
        let (mut rz, mut n) = (vec![T::zero(); rows * 2 * h], vec![T::zero(); rows * h]);
        let (mut hn, mut hs) = (vec![T::zero(); rows * h], vec![T::zero(); rows * h]);
        let mut hw = vec![T::zero(); bsz * h3];
        for t in 0..steps {
            project_hidden(&z, w, b_hh, d, t, &mut hw);
            for r in 0..bsz {
                let at = r * steps + t;
                let (xr, hr) = (&xw[at * h3..(at + 1) * h3], &hw[r * h3..(r + 1) * h3]);
                let rz_r = &mut rz[at * 2 * h..(at + 1) * 2 * h];
                for j in 0..2 * h {
                    rz_r[j] = xr[j] + hr[j]; // xw_rz + hw_rz, as the per-step add
                }
                let n_r = &mut n[at * h..(at + 1) * h];
                gru_n_row(rz_r, xr, hr, n_r);
                hn[at * h..(at + 1) * h].copy_from_slice(&hr[2 * h..]);
                let h_prev = &z[at * k + n_in..(at + 1) * k];
                let h_out = &mut hs[at * h..(at + 1) * h];
                gru_h_row(rz_r, n_r, h_prev, h_out);
                if t + 1 < steps {
                    z[(at + 1) * k + n_in..(at + 2) * k].copy_from_slice(h_out);
                }
            }
        }
        let saved = Saved {
            rz: T::to_cpu_storage_owned(rz),
            n: T::to_cpu_storage_owned(n),
            hn: T::to_cpu_storage_owned(hn),
            z: T::to_cpu_storage_owned(z),
        };
        // A fresh op per call: the cell is empty here.
        let _ = self.saved.set(saved);
        hs
    }
}

impl CustomOp3 for GruLayer {
    fn name(&self) -> &'static str {
        "nanhunt-gru-layer"
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
        let d = Sizes::of(l1, l2, l3, 3, "gru layer")?;
        with_real!(s1, T => {
            let (x, w, b) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
            let hs = wide(#[inline(always)] || self.forward::<T>(x, w, b, d));
            Ok((T::to_cpu_storage_owned(hs), Shape::from((d.b, d.s, d.h))))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<Grads3> {
        // No input gradient when the input is data (the first layer's).
        let x_grad = x.track_op();
        let grad_op = GruLayerGrad {
            saved: self.saved.clone(),
            x_grad,
        };
        let packed = w.apply_op2_no_bwd(&grad.contiguous()?, &grad_op)?;
        unpack_grads(&packed, x, w, b, x_grad)
    }
}

/// (w, dhs) and the saved state → [dx (when wanted) | dw | db].
struct GruLayerGrad {
    saved: Arc<OnceLock<Saved>>,
    x_grad: bool,
}

impl GruLayerGrad {
    #[inline(always)] // into `wide`'s AVX2 build
    fn backward<T: Real>(&self, w: &[T], dhs: &[T], d: Sizes) -> Result<Vec<T>> {
        let Some(saved) = self.saved.get() else {
            candle_core::bail!("gru layer: backward before forward");
        };
        let rz = saved.rz.as_slice::<T>()?;
        let (n, hn, z) = (
            saved.n.as_slice::<T>()?,
            saved.hn.as_slice::<T>()?,
            saved.z.as_slice::<T>()?,
        );
        let Sizes {
            b: bsz,
            s: steps,
            n_in,
            h,
        } = d;
        let (h3, k, rows) = (3 * h, d.k(), bsz * steps);
        let one = T::one();
        // The gradients of the input and hidden projections of every row:
        // equal on r and z, different on n.
        let (mut dxw, mut dhw) = (vec![T::zero(); rows * h3], vec![T::zero(); rows * h3]);
        // The gradient reaching h_{t-1}, from step t.
        let mut dh_next = vec![T::zero(); bsz * h];
        for t in (0..steps).rev() {
            for r in 0..bsz {
                let at = r * steps + t;
                let (rzr, nr, hnr) = (&rz[at * 2 * h..], &n[at * h..], &hn[at * h..]);
                let h_prev = &z[at * k + n_in..(at + 1) * k];
                let dh_out = &dhs[at * h..(at + 1) * h];
                let dhn = &mut dh_next[r * h..(r + 1) * h];
                let (dx_r, dh_r) = (
                    &mut dxw[at * h3..(at + 1) * h3],
                    &mut dhw[at * h3..(at + 1) * h3],
                );
                for j in 0..h {
                    let dh = dh_out[j] + dhn[j];
                    let (reset, update) = (sigmoid(rzr[j]), sigmoid(rzr[h + j]));
                    let nj = nr[j];
                    let dpre_z = dh * (h_prev[j] - nj) * update * (one - update);
                    let dpre_n = dh * (one - update) * (one - nj * nj);
                    let dpre_r = dpre_n * hnr[j] * reset * (one - reset);
                    (dx_r[j], dh_r[j]) = (dpre_r, dpre_r);
                    (dx_r[h + j], dh_r[h + j]) = (dpre_z, dpre_z);
                    dx_r[2 * h + j] = dpre_n;
                    dh_r[2 * h + j] = dpre_n * reset;
                    // h' = n + z·(h_prev − n): the direct path to h_prev
                    dhn[j] = dh * update;
                }
            }
            if t > 0 {
                // dh_{t-1} += dhw_t · W_hh
                backprop_hidden(&dhw, w, d, t, &mut dh_next, true);
            }
        }
        let dx_len = if self.x_grad { rows * n_in } else { 0 };
        let mut out = vec![T::zero(); dx_len + h3 * k + 2 * h3];
        let (dx, rest) = out.split_at_mut(dx_len);
        let (dw, db) = rest.split_at_mut(h3 * k);
        // dW_ih = dxwᵀ · x and dW_hh = dhwᵀ · h_prev, each one product over
        // every row, into their columns of the joined weight.
        let x_rows = Mat {
            data: z,
            rs: k,
            cs: 1,
        };
        let h_rows = Mat {
            data: &z[n_in..],
            rs: k,
            cs: 1,
        };
        matmul_strided(
            (h3, n_in, rows),
            Mat::transposed(&dxw, h3),
            x_rows,
            dw,
            k,
            false,
            one,
        );
        matmul_strided(
            (h3, h, rows),
            Mat::transposed(&dhw, h3),
            h_rows,
            &mut dw[n_in..],
            k,
            false,
            one,
        );
        let (db_ih, db_hh) = db.split_at_mut(h3);
        for (xr, hr) in dxw.chunks_exact(h3).zip(dhw.chunks_exact(h3)) {
            db_ih.iter_mut().zip(xr).for_each(|(d, &v)| *d += v);
            db_hh.iter_mut().zip(hr).for_each(|(d, &v)| *d += v);
        }
        if self.x_grad {
            let w_ih = Mat {
                data: w,
                rs: k,
                cs: 1,
            };
            matmul((rows, n_in, h3), Mat::rows(&dxw, h3), w_ih, dx, false);
        }
        Ok(out)
    }
}

impl CustomOp2 for GruLayerGrad {
    fn name(&self) -> &'static str {
        "nanhunt-gru-layer-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = Sizes::of_grad(l1, l2, 3, "gru layer")?;
        with_real!(s1, T => {
            let (w, dhs) = (slice(s1, l1)?, slice(s2, l2)?);
            let out = wide(#[inline(always)] || self.backward::<T>(w, dhs, d))?;
            flat(out)
        })
    }
}
