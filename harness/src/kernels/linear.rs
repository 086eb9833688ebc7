//! The affine map `x·wᵀ + b` of a (rows, in) matrix as one op, with the
//! weight and bias gradients as one fused op and the input gradient only
//! when the input needs one. candle's version is a product, a broadcast add
//! and, backward, two products on transposed views and a strided reduction
//! over the rows for the bias.

use super::gemm::{matmul, Mat};
use super::reference;
use super::{flat, fused_for, slice, unpack, with_real, Real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// x (N, in) · w (out, in)ᵀ + b (out) → (N, out).
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return reference::linear(x, w, b);
    }
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, Linear)
}

fn dims2(l: &Layout, what: &str) -> Result<(usize, usize)> {
    match *l.dims() {
        [a, b] => Ok((a, b)),
        ref other => candle_core::bail!("linear: {what} must be 2-D, got {other:?}"),
    }
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
        let (n, k) = dims2(l1, "input")?;
        let (o, k2) = dims2(l2, "weight")?;
        if k != k2 || l3.shape().elem_count() != o {
            candle_core::bail!("linear: input (·, {k}), weight ({o}, {k2}) and bias do not fit");
        }
        with_real!(s1, T => {
            let (x, w, b) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let mut y = Vec::with_capacity(n * o);
            for _ in 0..n {
                y.extend_from_slice(b);
            }
            matmul((n, o, k), Mat::rows(x, k), Mat::transposed(w, k), &mut y, true);
            Ok((T::to_cpu_storage_owned(y), Shape::from((n, o))))
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

/// (grad (N, out), w (out, in)) → dx = grad · w.
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
        let (n, o) = dims2(l1, "gradient")?;
        let (_, k) = dims2(l2, "weight")?;
        with_real!(s1, T => {
            let mut dx = vec![T::zero(); n * k];
            matmul((n, k, o), Mat::rows(slice::<T>(s1, l1)?, o), Mat::rows(slice::<T>(s2, l2)?, k), &mut dx, false);
            Ok((T::to_cpu_storage_owned(dx), Shape::from((n, k))))
        })
    }
}

/// (x (N, in), grad (N, out)) → [dw = gradᵀ·x (out·in) | db = Σ rows (out)].
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
        let (n, k) = dims2(l1, "input")?;
        let (_, o) = dims2(l2, "gradient")?;
        with_real!(s1, T => {
            let out = ParamGrad::compute::<T>(slice(s1, l1)?, slice(s2, l2)?, (n, k, o));
            flat(out)
        })
    }
}
