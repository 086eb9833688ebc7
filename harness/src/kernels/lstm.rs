//! A whole LSTM layer over the sequence as one op, forward and backward, as
//! PyTorch's CPU LSTM runs it. Step by step, the cell ops cost a dozen
//! candle ops per time step plus a zero-filled gradient buffer and an add
//! for every one of them, and the weight gradient is summed from one small
//! product per step. Here the recurrence is one loop of a (B×H)·(H×4H)
//! product and the fused cell per step, and the backward pass
//! (backpropagation through time) is one op whose weight gradient is one
//! product over every step.
//!
//! The input projection stays outside the op: one `linear` over all B·S
//! rows gives `xw` (B, S, 4H). The op takes it with the hidden weight
//! (4H, H) and bias (4H) and returns every hidden state (B, S, H).
//!
//! The forward pass computes, per step, exactly what the per-step ops
//! compute (the same product shapes and the same scalar code: `linear` of h,
//! `xw_t + hw`, `lstm_activate`, `lstm_c`, `lstm_h`), so a traced re-run,
//! which runs the per-step ops to record every step's gates, c and h, sees
//! the same forward bits. Its gradients differ from the per-step ones only
//! in summation order.

use super::cell::{activate_grad_row, activate_row, lstm_c_row, lstm_h_row};
use super::gemm::{matmul, Mat};
use super::reference;
use super::{flat, fused_for, slice, unpack, with_real, Real};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, WithDType};
use std::sync::{Arc, OnceLock};

/// Every hidden state (B, S, H) of an LSTM layer with zero initial state,
/// from the projected inputs `xw` (B, S, 4H) = x·W_ihᵀ + b_ih, the hidden
/// weight `w` (4H, H) and bias `b` (4H). Gates in PyTorch's (i, f, g, o) order.
pub fn lstm_layer(xw: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !fused_for(xw) {
        return reference::lstm_layer(xw, w, b);
    }
    xw.contiguous()?.apply_op3(
        &w.contiguous()?,
        &b.contiguous()?,
        LstmLayer {
            saved: Arc::default(),
        },
    )
}

/// What the forward pass keeps for the backward pass: the activated gates
/// (B, S, 4H) and the cell states (B, S, H) of every step.
struct Saved {
    act: CpuStorage,
    c: CpuStorage,
}

struct LstmLayer {
    saved: Arc<OnceLock<Saved>>,
}

/// (batch, steps, hidden) from `xw` (B, S, 4H), checked against w and b.
fn sizes(l1: &Layout, l2: &Layout, l3: &Layout) -> Result<(usize, usize, usize)> {
    let (bsz, steps, h4) = match *l1.dims() {
        [b, s, h4] if h4 % 4 == 0 => (b, s, h4),
        ref other => candle_core::bail!("lstm layer: xw must be (B, S, 4H), got {other:?}"),
    };
    let h = h4 / 4;
    if l2.dims() != [h4, h] || l3.dims() != [h4] {
        candle_core::bail!(
            "lstm layer: weight {:?} and bias {:?} do not fit xw (·, ·, {h4})",
            l2.dims(),
            l3.dims()
        );
    }
    Ok((bsz, steps, h))
}

impl LstmLayer {
    fn forward<T: Real>(
        &self,
        xw: &[T],
        w: &[T],
        b: &[T],
        (bsz, steps, h): (usize, usize, usize),
    ) -> Vec<T> {
        let h4 = 4 * h;
        let mut hs = vec![T::zero(); bsz * steps * h];
        let mut act = vec![T::zero(); bsz * steps * h4];
        let mut cs = vec![T::zero(); bsz * steps * h];
        // The running state as contiguous (B, H) matrices, as the per-step
        // ops hold it.
        let (mut h_prev, mut c_prev) = (vec![T::zero(); bsz * h], vec![T::zero(); bsz * h]);
        let mut gates = vec![T::zero(); bsz * h4];
        let mut c_new = vec![T::zero(); h];
        for t in 0..steps {
            // hw = h·wᵀ + b, exactly as `linear` forms it.
            for row in gates.chunks_exact_mut(h4) {
                row.copy_from_slice(b);
            }
            matmul(
                (bsz, h4, h),
                Mat::rows(&h_prev, h),
                Mat::transposed(w, h),
                &mut gates,
                true,
            );
            for r in 0..bsz {
                let at = r * steps + t;
                let g = &mut gates[r * h4..(r + 1) * h4];
                for (g, &x) in g.iter_mut().zip(&xw[at * h4..(at + 1) * h4]) {
                    *g = x + *g;
                }
                activate_row(g, h);
                let (cp, hp) = (
                    &mut c_prev[r * h..(r + 1) * h],
                    &mut h_prev[r * h..(r + 1) * h],
                );
                lstm_c_row(g, cp, &mut c_new);
                cp.copy_from_slice(&c_new);
                lstm_h_row(g, cp, hp);
                act[at * h4..(at + 1) * h4].copy_from_slice(g);
                cs[at * h..(at + 1) * h].copy_from_slice(cp);
                hs[at * h..(at + 1) * h].copy_from_slice(hp);
            }
        }
        let saved = Saved {
            act: T::to_cpu_storage_owned(act),
            c: T::to_cpu_storage_owned(cs),
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
        let dims = sizes(l1, l2, l3)?;
        with_real!(s1, T => {
            let hs = self.forward::<T>(slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?, dims);
            Ok((T::to_cpu_storage_owned(hs), Shape::from((dims.0, dims.1, dims.2))))
        })
    }

    fn bwd(
        &self,
        xw: &Tensor,
        w: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad_op = LstmLayerGrad {
            saved: self.saved.clone(),
        };
        let packed = w.apply_op3_no_bwd(res, &grad.contiguous()?, &grad_op)?;
        let [dxw, dw, db] = unpack(&packed, [xw.shape(), w.shape(), b.shape()])?;
        Ok((Some(dxw), Some(dw), Some(db)))
    }
}

/// (w, hs, dhs) and the saved gates and cell states → [dxw | dw | db].
struct LstmLayerGrad {
    saved: Arc<OnceLock<Saved>>,
}

impl LstmLayerGrad {
    fn backward<T: Real>(
        &self,
        w: &[T],
        hs: &[T],
        dhs: &[T],
        (bsz, steps, h): (usize, usize, usize),
    ) -> Result<Vec<T>> {
        let Some(saved) = self.saved.get() else {
            candle_core::bail!("lstm layer: backward before forward");
        };
        let (act, cs) = (saved.act.as_slice::<T>()?, saved.c.as_slice::<T>()?);
        let h4 = 4 * h;
        let one = T::one();
        let mut out = vec![T::zero(); bsz * steps * h4 + h4 * h + h4];
        let (dxw, rest) = out.split_at_mut(bsz * steps * h4);
        let (dw, db) = rest.split_at_mut(h4 * h);
        // The gradients reaching step t from step t + 1: through h (the
        // recurrent product) and through c (times f).
        let (mut dh_next, mut dc_next) = (vec![T::zero(); bsz * h], vec![T::zero(); bsz * h]);
        let mut dgates = vec![T::zero(); bsz * h4];
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
                activate_grad_row(a, &dact, &mut dgates[r * h4..(r + 1) * h4], h);
                dxw[at * h4..(at + 1) * h4].copy_from_slice(&dgates[r * h4..(r + 1) * h4]);
            }
            if t > 0 {
                // dh_{t-1} = dgates · w
                matmul(
                    (bsz, h, h4),
                    Mat::rows(&dgates, h4),
                    Mat::rows(w, h),
                    &mut dh_next,
                    false,
                );
            }
        }
        // dw = Σ_t dgates_tᵀ · h_{t-1}: one product over every (b, t) row,
        // against the hidden states shifted one step (zero at t = 0).
        let mut h_prev = vec![T::zero(); bsz * steps * h];
        for r in 0..bsz {
            let base = r * steps * h;
            let len = steps.saturating_sub(1) * h;
            h_prev[base + h..base + h + len].copy_from_slice(&hs[base..base + len]);
        }
        matmul(
            (h4, h, bsz * steps),
            Mat::transposed(dxw, h4),
            Mat::rows(&h_prev, h),
            dw,
            false,
        );
        for row in dxw.chunks_exact(h4) {
            db.iter_mut().zip(row).for_each(|(d, &v)| *d += v);
        }
        Ok(out)
    }
}

impl CustomOp3 for LstmLayerGrad {
    fn name(&self) -> &'static str {
        "nanhunt-lstm-layer-grad"
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
        let (bsz, steps, h) = match *l2.dims() {
            [b, s, h] => (b, s, h),
            ref other => {
                candle_core::bail!("lstm layer: hidden states must be (B, S, H), got {other:?}")
            }
        };
        if l1.dims() != [4 * h, h] || l3.dims() != l2.dims() {
            candle_core::bail!(
                "lstm layer: weight {:?} or gradient {:?} does not fit",
                l1.dims(),
                l3.dims()
            );
        }
        with_real!(s1, T => {
            let out = self.backward::<T>(slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?, (bsz, steps, h))?;
            flat(out)
        })
    }
}
