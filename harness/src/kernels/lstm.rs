//! A whole LSTM layer over the sequence as one op, forward and backward, as
//! PyTorch's CPU LSTM runs it. Step by step, the cell ops cost a dozen
//! candle ops per time step plus a zero-filled gradient buffer and an add
//! for every one of them, and the weight gradient is summed from one small
//! product per step. Here the recurrence is one loop of a (B×H)·(H×4H)
//! product and the fused cell per step, and the backward pass
//! (backpropagation through time) is one op whose weight gradient is one
//! product over every step.
//!
//! The input projection is inside the op too, as one product over all B·S
//! rows, so that the projected inputs (B, S, 4H) never become a graph node
//! (whose gradient candle would zero-fill and then add into). The two
//! weights travel as one (4H, in + H) tensor and the two biases as one
//! (2, 4H), so that the op has three inputs; their gradients are one
//! product over [x | h_prev] rows.
//!
//! The forward pass computes, per step, exactly what the per-step ops
//! compute (the same product shapes and the same scalar code: `linear` of x
//! and of h, `xw_t + hw`, `lstm_activate`, `lstm_c`, `lstm_h`), so a traced
//! re-run, which runs the per-step ops to record every step's gates, c and
//! h, sees the same forward bits (tested in `runner::tests`). Its gradients
//! differ from the per-step ones only in summation order.

use super::cell::{activate_grad_row, activate_row, lstm_c_row, lstm_h_row};
use super::recurrent::{
    backprop_hidden, joined, project_hidden, project_inputs, shared_param_grads, unpack_grads,
    Grads3, Sizes,
};
use super::reference;
use super::{flat, fused_for, slice, widest, with_real, Real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};
use std::sync::{Arc, OnceLock};

/// Every hidden state (B, S, H) of an LSTM layer with zero initial state,
/// from the inputs `x` (B, S, in) and PyTorch's parameters: `w_ih` (4H, in),
/// `b_ih` (4H), `w_hh` (4H, H), `b_hh` (4H), gates in (i, f, g, o) order.
pub fn lstm_layer(
    x: &Tensor,
    w_ih: &Tensor,
    b_ih: &Tensor,
    w_hh: &Tensor,
    b_hh: &Tensor,
) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::lstm_layer(x, w_ih, b_ih, w_hh, b_hh);
    }
    let (w, b) = joined(w_ih, b_ih, w_hh, b_hh)?;
    x.contiguous()?.apply_op3(
        &w,
        &b,
        LstmLayer {
            saved: Arc::default(),
        },
    )
}

/// What the forward pass keeps for the backward pass, for every step: the
/// activated gates (B·S, 4H), the cell states (B·S, H), and the rows
/// [x_t | h_{t-1}] (B·S, in + H) that the weight gradient multiplies.
struct Saved {
    act: CpuStorage,
    c: CpuStorage,
    z: CpuStorage,
}

struct LstmLayer {
    saved: Arc<OnceLock<Saved>>,
}

impl LstmLayer {
    #[inline(always)] // into `widest`'s build
    fn forward<T: Real>(&self, x: &[T], w: &[T], b: &[T], d: Sizes) -> Vec<T> {
        let Sizes {
            b: bsz,
            s: steps,
            n_in,
            h,
        } = d;
        let (h4, k, rows) = (4 * h, d.k(), bsz * steps);
        let (b_ih, b_hh) = b.split_at(h4);
        // act starts as the projected inputs, and each step turns its rows
        // into the activated gates in place.
        let (mut act, mut z) = project_inputs(x, w, b_ih, d);
        let mut hs = vec![T::zero(); rows * h];
        let mut cs = vec![T::zero(); rows * h];
        let mut hw = vec![T::zero(); bsz * h4];
        let zeros = vec![T::zero(); h];
        for t in 0..steps {
            project_hidden(&z, w, b_hh, d, t, &mut hw);
            for r in 0..bsz {
                let at = r * steps + t;
                let a = &mut act[at * h4..(at + 1) * h4];
                for (g, &v) in a.iter_mut().zip(&hw[r * h4..(r + 1) * h4]) {
                    *g += v; // xw_t + hw, as the per-step add
                }
                activate_row(a, h);
                let (before, from) = cs.split_at_mut(at * h);
                let c_prev = if t > 0 {
                    &before[(at - 1) * h..]
                } else {
                    &zeros[..]
                };
                let c = &mut from[..h];
                lstm_c_row(a, c_prev, c);
                let h_out = &mut hs[at * h..(at + 1) * h];
                lstm_h_row(a, c, h_out);
                if t + 1 < steps {
                    z[(at + 1) * k + n_in..(at + 2) * k].copy_from_slice(h_out);
                }
            }
        }
        let saved = Saved {
            act: T::to_cpu_storage_owned(act),
            c: T::to_cpu_storage_owned(cs),
            z: T::to_cpu_storage_owned(z),
        };
        // A fresh op per call: the cell is empty here.
        let _ = self.saved.set(saved);
        hs
    }
}

impl CustomOp3 for LstmLayer {
    fn name(&self) -> &'static str {
        "nanhunt-lstm-layer"
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
        let d = Sizes::of(l1, l2, l3, 4, "lstm layer")?;
        with_real!(s1, T => {
            let (x, w, b) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
            let hs = widest(#[inline(always)] || self.forward::<T>(x, w, b, d));
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
        let grad_op = LstmLayerGrad {
            saved: self.saved.clone(),
            x_grad,
        };
        let packed = w.apply_op2_no_bwd(&grad.contiguous()?, &grad_op)?;
        unpack_grads(&packed, x, w, b, x_grad)
    }
}

/// (w, dhs) and the saved gates, cell states and [x | h] rows →
/// [dx (when wanted) | dw | db].
struct LstmLayerGrad {
    saved: Arc<OnceLock<Saved>>,
    x_grad: bool,
}

impl LstmLayerGrad {
    #[inline(always)] // into `widest`'s build
    fn backward<T: Real>(&self, w: &[T], dhs: &[T], d: Sizes) -> Result<Vec<T>> {
        let Some(saved) = self.saved.get() else {
            candle_core::bail!("lstm layer: backward before forward");
        };
        let (act, cs, z) = (
            saved.act.as_slice::<T>()?,
            saved.c.as_slice::<T>()?,
            saved.z.as_slice::<T>()?,
        );
        let Sizes {
            b: bsz,
            s: steps,
            h,
            ..
        } = d;
        let (h4, rows) = (4 * h, bsz * steps);
        let one = T::one();
        // The gate pre-activation gradients of every row.
        let mut dg_all = vec![T::zero(); rows * h4];
        // The gradients reaching step t from step t + 1: through h (the
        // recurrent product) and through c (times f).
        let (mut dh_next, mut dc_next) = (vec![T::zero(); bsz * h], vec![T::zero(); bsz * h]);
        let mut dact = vec![T::zero(); h4];
        let zeros = vec![T::zero(); h];
        for t in (0..steps).rev() {
            for r in 0..bsz {
                let at = r * steps + t;
                let a = &act[at * h4..(at + 1) * h4];
                let (i, f, g, o) = (&a[..h], &a[h..2 * h], &a[2 * h..3 * h], &a[3 * h..]);
                let c = &cs[at * h..(at + 1) * h];
                let c_prev = if t > 0 {
                    &cs[(at - 1) * h..at * h]
                } else {
                    &zeros[..]
                };
                let dh_out = &dhs[at * h..(at + 1) * h];
                let (dhn, dcn) = (
                    &mut dh_next[r * h..(r + 1) * h],
                    &mut dc_next[r * h..(r + 1) * h],
                );
                let (di, rest) = dact.split_at_mut(h);
                let (df, rest) = rest.split_at_mut(h);
                let (dg, d_o) = rest.split_at_mut(h);
                for j in 0..h {
                    let dh = dh_out[j] + dhn[j];
                    let tc = c[j].tanh_fast();
                    d_o[j] = dh * tc;
                    let dc = dh * o[j] * (one - tc * tc) + dcn[j];
                    di[j] = dc * g[j];
                    df[j] = dc * c_prev[j];
                    dg[j] = dc * i[j];
                    dcn[j] = dc * f[j];
                }
                activate_grad_row(a, &dact, &mut dg_all[at * h4..(at + 1) * h4], h);
            }
            if t > 0 {
                // dh_{t-1} = dgates_t · W_hh
                backprop_hidden(&dg_all, w, d, t, &mut dh_next, false);
            }
        }
        let out = shared_param_grads(&dg_all, z, w, d, h4, self.x_grad);
        Ok(out)
    }
}

impl CustomOp2 for LstmLayerGrad {
    fn name(&self) -> &'static str {
        "nanhunt-lstm-layer-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = Sizes::of_grad(l1, l2, 4, "lstm layer")?;
        with_real!(s1, T => {
            let (w, dhs) = (slice(s1, l1)?, slice(s2, l2)?);
            let out = widest(#[inline(always)] || self.backward::<T>(w, dhs, d))?;
            flat(out)
        })
    }
}
