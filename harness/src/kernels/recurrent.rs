//! What the whole-layer recurrent ops (`lstm`, `gru`, `tanh_rnn`) share:
//! their sizes, the joined weights and biases they take (so that each op
//! has three inputs), and the unpacking of their packed gradients.

use super::unpack;
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
