//! The affine map `x·wᵀ + b` of a (..., in) tensor as one op, with the
//! weight and bias gradients as one fused op and the input gradient only
//! when the input needs one. candle's version is a product, a broadcast add
//! and, backward, two products on transposed views and a strided reduction
//! over the rows for the bias.
//!
//! Leading dimensions are rows inside the op: a reshape to rows and back
//! around it would be two more graph nodes, each a zero-filled gradient
//! buffer and an add in candle's backward pass (one pass over the input
//! and one over the output per linear map, 7% of the decoder's step).
//! Their gradients were copies, so the bits are the same without them.

use super::gemm::{matmul, Mat};
use super::reference;
use super::{flat, fused_for, slice, unpack, with_real, Real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// x (..., in) · w (out, in)ᵀ + b (out) → (..., out).
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::linear(x, w, b);
    }
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, Linear)
}

/// (rows, last dimension) of a tensor of rank ≥ 2 (a weight's is 2).
fn rows_and_width(l: &Layout, what: &str) -> Result<(usize, usize)> {
    match *l.dims() {
        [.., width] if l.dims().len() >= 2 && width > 0 => {
            Ok((l.shape().elem_count() / width, width))
        }
        ref other => {
            candle_core::bail!(
                "linear: {what} needs rank 2 or more and a last dimension, got {other:?}"
            )
        }
    }
}

/// `dims` with the last dimension replaced by `width`.
fn with_width(dims: &[usize], width: usize) -> Shape {
    let mut out = dims.to_vec();
    if let Some(last) = out.last_mut() {
        *last = width;
    }
    Shape::from(out)
}

struct Linear;

impl CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        "nanhunt-linear"
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
        let (n, k) = rows_and_width(l1, "input")?;
        let (o, k2) = rows_and_width(l2, "weight")?;
        if l2.dims().len() != 2 || k != k2 || l3.shape().elem_count() != o {
            candle_core::bail!("linear: input (·, {k}), weight ({o}, {k2}) and bias do not fit");
        }
        with_real!(s1, T => {
            let (x, w, b) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let mut y = Vec::with_capacity(n * o);
            for _ in 0..n {
                y.extend_from_slice(b);
            }
            matmul((n, o, k), Mat::rows(x, k), Mat::transposed(w, k), &mut y, true);
            Ok((T::to_cpu_storage_owned(y), with_width(l1.dims(), o)))
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
            Some(grad.apply_op2_no_bwd(w, &InputGrad)?)
        } else {
            None
        };
        let packed = x.apply_op2_no_bwd(&grad, &ParamGrad)?;
        let [dw, db] = unpack(&packed, [w.shape(), b.shape()])?;
        Ok((dx, Some(dw), Some(db)))
    }
}

/// (grad (..., out), w (out, in)) → dx = grad · w, (..., in).
struct InputGrad;

impl CustomOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "nanhunt-linear-input-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, o) = rows_and_width(l1, "gradient")?;
        let (_, k) = rows_and_width(l2, "weight")?;
        with_real!(s1, T => {
            let mut dx = vec![T::zero(); n * k];
            matmul((n, k, o), Mat::rows(slice::<T>(s1, l1)?, o), Mat::rows(slice::<T>(s2, l2)?, k), &mut dx, false);
            Ok((T::to_cpu_storage_owned(dx), with_width(l1.dims(), k)))
        })
    }
}

/// (x (..., in), grad (..., out)) → [dw = gradᵀ·x (out·in) | db = Σ rows (out)].
struct ParamGrad;

impl ParamGrad {
    fn compute<T: Real>(x: &[T], g: &[T], (n, k, o): (usize, usize, usize)) -> Vec<T> {
        let mut out = vec![T::zero(); o * k + o];
        let (dw, db) = out.split_at_mut(o * k);
        matmul((o, k, n), Mat::transposed(g, o), Mat::rows(x, k), dw, false);
        for row in g.chunks_exact(o) {
            db.iter_mut().zip(row).for_each(|(d, &v)| *d += v);
        }
        out
    }
}

impl CustomOp2 for ParamGrad {
    fn name(&self) -> &'static str {
        "nanhunt-linear-param-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, k) = rows_and_width(l1, "input")?;
        let (_, o) = rows_and_width(l2, "gradient")?;
        with_real!(s1, T => {
            let out = ParamGrad::compute::<T>(slice(s1, l1)?, slice(s2, l2)?, (n, k, o));
            flat(out)
        })
    }
}
