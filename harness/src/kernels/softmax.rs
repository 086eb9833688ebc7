//! Softmax over the last dimension (the row maximum subtracted), with the
//! backward pass `dx = y · (g - Σ g·y)` as one op; and the causal softmax
//! of attention, whose keys after the query are -inf, as one op too.

use super::reference;
use super::{fused_for, lane_max, lane_sum, slice, widest, with_real, Real};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};

/// Softmax over the last dimension, fused forward and backward.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::softmax(x);
    }
    x.contiguous()?.apply_op1(Softmax { causal: false })
}

/// Softmax over the keys of attention scores (..., S, S) where key j is
/// blocked (-inf) after query i: what the composition of a causal mask
/// (`where_cond` with -inf) and the softmax computes, with its bits, in
/// one op. The mask's `where_cond` was a pass forward and, backward, three
/// zero-filled buffers of the scores' size and four passes over them.
pub fn causal_softmax(scores: &Tensor) -> Result<Tensor> {
    let square = scores.rank() >= 2 && {
        let dims = scores.dims();
        dims[dims.len() - 1] == dims[dims.len() - 2]
    };
    if !fused_for(scores) || !square {
        return reference::causal_softmax(scores);
    }
    scores.contiguous()?.apply_op1(Softmax { causal: true })
}

fn last_dim(l: &Layout) -> Result<usize> {
    match l.dims().last() {
        Some(&d) if d > 0 => Ok(d),
        _ => candle_core::bail!("softmax: input needs a non-empty last dimension"),
    }
}

/// The softmax over the last dimension; `causal`: of (..., S, S) scores
/// with the keys after each query blocked.
struct Softmax {
    causal: bool,
}

/// The keys of row `r` of (..., S, S) scores that stay open: the query's
/// own and those before it when causal, all `d` otherwise.
#[inline(always)]
fn open_keys(causal: bool, r: usize, d: usize) -> usize {
    if causal {
        r % d + 1
    } else {
        d
    }
}

/// The softmax of `row` with its entries from `open` on replaced by -inf
/// (computed as such, so that every case gives the masked row's bits).
#[inline(always)]
fn softmax_row_open<T: Real>(row: &[T], open: usize, out: &mut [T]) {
    let d = row.len();
    // NaN-ignoring max (the blocked -inf never raise it); a NaN, ±inf or
    // all -inf row still ends up NaN through `x - max`, as in the reference.
    let max = lane_max(open, |i| row[i]);
    for i in 0..d {
        let v = if i < open { row[i] } else { T::neg_infinity() };
        out[i] = (v - max).exp_fast();
    }
    let sum = lane_sum(d, |i| out[i]);
    for v in out.iter_mut() {
        *v /= sum;
    }
}

#[inline(always)]
fn softmax_row<T: Real>(row: &[T], out: &mut [T]) {
    softmax_row_open(row, row.len(), out)
}

#[inline(always)] // into `widest`'s build
fn softmax_rows<T: Real>(x: &[T], d: usize, causal: bool) -> Vec<T> {
    let mut y = vec![T::zero(); x.len()];
    for (r, (row, out)) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).enumerate() {
        softmax_row_open(row, open_keys(causal, r, d), out);
    }
    y
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        if self.causal {
            "nanhunt-causal-softmax"
        } else {
            "nanhunt-softmax"
        }
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l)?;
        let causal = self.causal;
        with_real!(s, T => {
            let x = slice(s, l)?;
            let y = widest(#[inline(always)] || softmax_rows::<T>(x, d, causal));
            Ok((T::to_cpu_storage_owned(y), l.shape().clone()))
        })
    }

    fn bwd(&self, _x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        let op = SoftmaxGrad {
            causal: self.causal,
        };
        Ok(Some(res.apply_op2_no_bwd(&grad, &op)?))
    }
}

/// (y, grad) → dx = y · (g - Σ g·y); causal: +0 at the blocked keys (what
/// `where_cond` hands back there, whatever the softmax's gradient was).
struct SoftmaxGrad {
    causal: bool,
}

#[inline(always)] // into `widest`'s build
fn softmax_grad_rows<T: Real>(y: &[T], g: &[T], d: usize, causal: bool) -> Vec<T> {
    let mut dx = vec![T::zero(); y.len()];
    let rows = y
        .chunks_exact(d)
        .zip(g.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d));
    for (r, ((yr, gr), out)) in rows.enumerate() {
        let dot = lane_sum(d, |i| yr[i] * gr[i]);
        for i in 0..d {
            out[i] = yr[i] * (gr[i] - dot);
        }
        out[open_keys(causal, r, d)..].fill(T::zero());
    }
    dx
}

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "nanhunt-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1)?;
        let causal = self.causal;
        with_real!(s1, T => {
            let (y, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let dx = widest(#[inline(always)] || softmax_grad_rows::<T>(y, g, d, causal));
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}

/// Softmax of attention scores (B, H, Sq, Sk) plus a per-key additive mask
/// `add` (B, 1, 1, Sk), broadcast over heads and queries (BERT's padding
/// mask): the broadcast add and the softmax in one op, with their bits. The
/// add's backward was two zeroed buffers of the scores' size and two
/// passes. When the mask needs a gradient (a traced re-run probes every
/// record's) the composition runs instead.
pub fn key_masked_softmax(scores: &Tensor, add: &Tensor) -> Result<Tensor> {
    let fits = match (scores.dims(), add.dims()) {
        (&[b, _, _, sk], &[b2, 1, 1, sk2]) => b == b2 && sk == sk2,
        _ => false,
    };
    if !fused_for(scores) || !fits || add.dtype() != scores.dtype() || add.track_op() {
        return reference::key_masked_softmax(scores, add);
    }
    scores
        .contiguous()?
        .apply_op2(&add.contiguous()?, KeyMaskedSoftmax)
}

struct KeyMaskedSoftmax;

#[inline(always)] // into `widest`'s build
fn key_masked_softmax_rows<T: Real>(x: &[T], add: &[T], d: usize) -> Vec<T> {
    let rows_per_batch = x.len() / add.len();
    let mut y = vec![T::zero(); x.len()];
    let mut sum = vec![T::zero(); d];
    for (r, (row, out)) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).enumerate() {
        let a = &add[(r / rows_per_batch) * d..][..d];
        for ((s, &v), &m) in sum.iter_mut().zip(row).zip(a) {
            *s = v + m;
        }
        softmax_row(&sum, out);
    }
    y
}

impl CustomOp2 for KeyMaskedSoftmax {
    fn name(&self) -> &'static str {
        "nanhunt-key-masked-softmax"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1)?;
        with_real!(s1, T => {
            let (x, add) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let y = widest(#[inline(always)] || key_masked_softmax_rows::<T>(x, add, d));
            Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _add: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // The broadcast add hands the softmax's gradient on to the scores
        // as it is; the mask is data here (checked when the op was built).
        let grad = grad.contiguous()?;
        let op = SoftmaxGrad { causal: false };
        Ok((Some(res.apply_op2_no_bwd(&grad, &op)?), None))
    }
}
