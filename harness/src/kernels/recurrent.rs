//! What the whole-layer recurrent ops (`lstm`, `gru`, `tanh_rnn`) share:
//! their sizes, the joined weights and biases they take (so that each op
//! has three inputs), and the unpacking of their packed gradients.

use super::gemm::{matmul, Mat};
use super::{unpack, Real};
use candle_core::{Layout, Result, Tensor};

/// The sizes of one layer: batch, steps, inputs, hidden.
#[derive(Clone, Copy)]
pub(super) struct Sizes {
    pub b: usize,
    pub s: usize,
    pub n_in: usize,
    pub h: usize,
}

impl Sizes {
    /// From x (B, S, in), the joined weight (G·H, in + H) and the biases
    /// (2, G·H) of a cell with `gates` gates.
    pub fn of(x: &Layout, w: &Layout, b: &Layout, gates: usize, what: &str) -> Result<Sizes> {
        let [bsz, s, n_in] = *x.dims() else {
            candle_core::bail!("{what}: x must be (B, S, in), got {:?}", x.dims());
        };
        let (h, ok) = match *w.dims() {
            [gh, k] if gh % gates == 0 && k == n_in + gh / gates => {
                (gh / gates, b.dims() == [2, gh])
            }
            _ => (0, false),
        };
        if !ok {
            candle_core::bail!(
                "{what}: weights {:?} and biases {:?} do not fit x (·, ·, {n_in})",
                w.dims(),
                b.dims()
            );
        }
        Ok(Sizes { b: bsz, s, n_in, h })
    }

    /// From the joined weight (G·H, in + H) and the gradient of the hidden
    /// states (B, S, H).
    pub fn of_grad(w: &Layout, dhs: &Layout, gates: usize, what: &str) -> Result<Sizes> {
        match (w.dims(), dhs.dims()) {
            (&[gh, k], &[b, s, h]) if gh == gates * h && k >= h => Ok(Sizes {
                b,
                s,
                n_in: k - h,
                h,
            }),
            (w, dhs) => candle_core::bail!(
                "{what}: weights {w:?} and hidden-state gradient {dhs:?} do not fit"
            ),
        }
    }

    /// The width of a [x | h] row.
    pub fn k(&self) -> usize {
        self.n_in + self.h
    }
}

/// The op's weight [w_ih | w_hh] (G·H, in + H) and biases [b_ih; b_hh] (2, G·H).
pub(super) fn joined(
    w_ih: &Tensor,
    b_ih: &Tensor,
    w_hh: &Tensor,
    b_hh: &Tensor,
) -> Result<(Tensor, Tensor)> {
    Ok((
        Tensor::cat(&[w_ih, w_hh], 1)?,
        Tensor::stack(&[b_ih, b_hh], 0)?,
    ))
}

/// The gradients of (x, w, b) from a packed [dx (when `x_grad`) | dw | db].
pub(super) type Grads3 = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

pub(super) fn unpack_grads(
    packed: &Tensor,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    x_grad: bool,
) -> Result<Grads3> {
    if x_grad {
        let [dx, dw, db] = unpack(packed, [x.shape(), w.shape(), b.shape()])?;
        Ok((Some(dx), Some(dw), Some(db)))
    } else {
        let [dw, db] = unpack(packed, [w.shape(), b.shape()])?;
        Ok((None, Some(dw), Some(db)))
    }
}

/// The projected inputs x·W_ihᵀ + b_ih of every (b, t) row, (B·S, G·H),
/// exactly as `linear` forms them (bias rows, then the product added), and
/// the rows [x_t | 0] (B·S, in + H) whose h part each step fills in with
/// h_{t-1}. `w` is the joined weight.
#[inline(always)]
pub(super) fn project_inputs<T: Real>(x: &[T], w: &[T], b_ih: &[T], d: Sizes) -> (Vec<T>, Vec<T>) {
    let (gw, k, rows) = (b_ih.len(), d.k(), d.b * d.s);
    let mut xw = vec![T::zero(); rows * gw];
    for row in xw.chunks_exact_mut(gw) {
        row.copy_from_slice(b_ih);
    }
    let w_ih_t = Mat {
        data: w,
        rs: 1,
        cs: k,
    };
    matmul(
        (rows, gw, d.n_in),
        Mat::rows(x, d.n_in),
        w_ih_t,
        &mut xw,
        true,
    );
    let mut z = vec![T::zero(); rows * k];
    for (zr, xr) in z.chunks_exact_mut(k).zip(x.chunks_exact(d.n_in)) {
        zr[..d.n_in].copy_from_slice(xr);
    }
    (xw, z)
}

/// hw (B, G·H) = h_{t-1}·W_hhᵀ + b_hh for step `t`, as `linear` forms it,
/// with h_{t-1} read from the z rows of step t.
#[inline(always)]
pub(super) fn project_hidden<T: Real>(
    z: &[T],
    w: &[T],
    b_hh: &[T],
    d: Sizes,
    t: usize,
    hw: &mut [T],
) {
    let (gw, k) = (b_hh.len(), d.k());
    for row in hw.chunks_exact_mut(gw) {
        row.copy_from_slice(b_hh);
    }
    let h_prev = Mat {
        data: &z[t * k + d.n_in..],
        rs: d.s * k,
        cs: 1,
    };
    let w_hh_t = Mat {
        data: &w[d.n_in..],
        rs: 1,
        cs: k,
    };
    matmul((d.b, gw, d.h), h_prev, w_hh_t, hw, true);
}

/// The gradient reaching h_{t-1} through the hidden projection of step
/// `t`: dh (B, H) = dg_t · W_hh, or += with `accumulate`, where dg holds
/// every row's gradient of the hidden projection (B·S, G·H).
#[inline(always)]
pub(super) fn backprop_hidden<T: Real>(
    dg: &[T],
    w: &[T],
    d: Sizes,
    t: usize,
    dh: &mut [T],
    accumulate: bool,
) {
    let (k, gw) = (d.k(), dg.len() / (d.b * d.s));
    let dg_t = Mat {
        data: &dg[t * gw..],
        rs: d.s * gw,
        cs: 1,
    };
    let w_hh = Mat {
        data: &w[d.n_in..],
        rs: k,
        cs: 1,
    };
    matmul((d.b, d.h, gw), dg_t, w_hh, dh, accumulate);
}

/// [dx (when `x_grad`) | dw | db] for a cell whose two projections get the
/// same gradient `dg` (B·S, G·H): [dW_ih | dW_hh] = dgᵀ·[x | h_prev] in one
/// product, both biases Σ rows of dg, dx = dg·W_ih.
#[inline(always)]
pub(super) fn shared_param_grads<T: Real>(
    dg: &[T],
    z: &[T],
    w: &[T],
    d: Sizes,
    gw: usize,
    x_grad: bool,
) -> Vec<T> {
    let (k, rows) = (d.k(), d.b * d.s);
    let dx_len = if x_grad { rows * d.n_in } else { 0 };
    let mut out = vec![T::zero(); dx_len + gw * k + 2 * gw];
    let (dx, rest) = out.split_at_mut(dx_len);
    let (dw, db) = rest.split_at_mut(gw * k);
    matmul(
        (gw, k, rows),
        Mat::transposed(dg, gw),
        Mat::rows(z, k),
        dw,
        false,
    );
    let (db_ih, db_hh) = db.split_at_mut(gw);
    for row in dg.chunks_exact(gw) {
        db_ih.iter_mut().zip(row).for_each(|(d, &v)| *d += v);
    }
    db_hh.copy_from_slice(db_ih);
    if x_grad {
        let w_ih = Mat {
            data: w,
            rs: k,
            cs: 1,
        };
        matmul((rows, d.n_in, gw), Mat::rows(dg, gw), w_ih, dx, false);
    }
    out
}
