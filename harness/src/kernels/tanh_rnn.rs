//! A whole vanilla (tanh) RNN layer over the sequence as one op, forward and
//! backward, as `lstm` and `gru` do for theirs: each step is
//! h_t = tanh(x_t·W_ihᵀ + b_ih + h_{t-1}·W_hhᵀ + b_hh). The input projection
//! is one product over all B·S rows, and both weight gradients one product
//! over [x | h_prev] rows (the pre-activation's gradient is the same for
//! both projections).
//!
//! The forward pass computes, per step, exactly what the per-step ops
//! compute: `linear` of x and of h, their sum, and `kernels::tanh`, so a
//! traced re-run sees the same forward bits (tested in `runner::tests`).

use super::recurrent::{
    backprop_hidden, joined, project_hidden, project_inputs, shared_param_grads, unpack_grads,
    Grads3, Sizes,
};
use super::reference;
use super::{flat, fused_for, slice, widest, with_real, Real};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, WithDType};
use std::sync::{Arc, OnceLock};

/// Every hidden state (B, S, H) of a tanh RNN layer with zero initial
/// state, from the inputs `x` (B, S, in) and PyTorch's parameters: `w_ih`
/// (H, in), `b_ih` (H), `w_hh` (H, H), `b_hh` (H).
pub fn tanh_rnn_layer(
    x: &Tensor,
    w_ih: &Tensor,
    b_ih: &Tensor,
    w_hh: &Tensor,
    b_hh: &Tensor,
) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::tanh_rnn_layer(x, w_ih, b_ih, w_hh, b_hh);
    }
    let (w, b) = joined(w_ih, b_ih, w_hh, b_hh)?;
    x.contiguous()?
        .apply_op3(&w, &b, TanhRnnLayer { z: Arc::default() })
}

struct TanhRnnLayer {
    /// The rows [x_t | h_{t-1}] (B·S, in + H) of every step, kept for the
    /// weight gradient.
    z: Arc<OnceLock<CpuStorage>>,
}

impl TanhRnnLayer {
    #[inline(always)] // into `widest`'s build
    fn forward<T: Real>(&self, x: &[T], w: &[T], b: &[T], d: Sizes) -> Vec<T> {
        let Sizes {
            b: bsz,
            s: steps,
            n_in,
            h,
        } = d;
        let k = d.k();
        let (b_ih, b_hh) = b.split_at(h);
        // hs starts as the projected inputs; each step turns its rows into
        // the hidden state in place.
        let (mut hs, mut z) = project_inputs(x, w, b_ih, d);
        let mut hw = vec![T::zero(); bsz * h];
        for t in 0..steps {
            project_hidden(&z, w, b_hh, d, t, &mut hw);
            for r in 0..bsz {
                let at = r * steps + t;
                let out = &mut hs[at * h..(at + 1) * h];
                for (o, &v) in out.iter_mut().zip(&hw[r * h..(r + 1) * h]) {
                    *o = (*o + v).tanh_fast(); // as `kernels::tanh`
                }
                if t + 1 < steps {
                    z[(at + 1) * k + n_in..(at + 2) * k].copy_from_slice(out);
                }
            }
        }
        // A fresh op per call: the cell is empty here.
        let _ = self.z.set(T::to_cpu_storage_owned(z));
        hs
    }
}

impl CustomOp3 for TanhRnnLayer {
    fn name(&self) -> &'static str {
        "nanhunt-tanh-rnn-layer"
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
        let d = Sizes::of(l1, l2, l3, 1, "rnn layer")?;
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
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<Grads3> {
        // No input gradient when the input is data (the first layer's).
        let x_grad = x.track_op();
        let grad_op = TanhRnnLayerGrad {
            z: self.z.clone(),
            x_grad,
        };
        let packed = w.apply_op3_no_bwd(res, &grad.contiguous()?, &grad_op)?;
        unpack_grads(&packed, x, w, b, x_grad)
    }
}

/// (w, hs, dhs) and the saved [x | h_prev] rows → [dx (when wanted) | dw | db].
struct TanhRnnLayerGrad {
    z: Arc<OnceLock<CpuStorage>>,
    x_grad: bool,
}

impl TanhRnnLayerGrad {
    #[inline(always)] // into `widest`'s build
    fn backward<T: Real>(&self, w: &[T], hs: &[T], dhs: &[T], d: Sizes) -> Result<Vec<T>> {
        let Some(z) = self.z.get() else {
            candle_core::bail!("rnn layer: backward before forward");
        };
        let z = z.as_slice::<T>()?;
        let Sizes {
            b: bsz,
            s: steps,
            h,
            ..
        } = d;
        let rows = bsz * steps;
        let one = T::one();
        // The pre-activation gradient of every row.
        let mut dpre = vec![T::zero(); rows * h];
        let mut dh_next = vec![T::zero(); bsz * h];
        for t in (0..steps).rev() {
            for r in 0..bsz {
                let at = r * steps + t;
                let (hr, dh_out) = (&hs[at * h..(at + 1) * h], &dhs[at * h..(at + 1) * h]);
                let dhn = &dh_next[r * h..(r + 1) * h];
                let dp = &mut dpre[at * h..(at + 1) * h];
                for j in 0..h {
                    dp[j] = (dh_out[j] + dhn[j]) * (one - hr[j] * hr[j]);
                }
            }
            if t > 0 {
                // dh_{t-1} = dpre_t · W_hh
                backprop_hidden(&dpre, w, d, t, &mut dh_next, false);
            }
        }
        let out = shared_param_grads(&dpre, z, w, d, h, self.x_grad);
        Ok(out)
    }
}

impl CustomOp3 for TanhRnnLayerGrad {
    fn name(&self) -> &'static str {
        "nanhunt-tanh-rnn-layer-grad"
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
        let d = Sizes::of_grad(l1, l3, 1, "rnn layer")?;
        if l2.dims() != l3.dims() {
            candle_core::bail!(
                "rnn layer: hidden states {:?} and their gradient {:?} differ",
                l2.dims(),
                l3.dims()
            );
        }
        with_real!(s1, T => {
            let (w, hs, dhs) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
            let out = widest(#[inline(always)] || self.backward::<T>(w, hs, dhs, d))?;
            flat(out)
        })
    }
}
