//! The mean over the positions of a (B, S, D) sequence, the Transformer
//! head's pooling, as one op each way. candle reduces over a middle
//! dimension with a division and a remainder per element, and its backward
//! is an affine map, a reshape and a broadcast, each a zeroed buffer and
//! an add. The bits are candle's: the positions summed in order from 0,
//! then the affine map x·(1/S) + 0; backward g·(1/S) + 0 at every position.

use super::reference;
use super::{fused_for, slice, with_real, Real};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};

/// x (B, S, D) → (B, D), the mean over S.
pub fn mean_positions(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) || x.rank() != 3 || x.elem_count() == 0 {
        return reference::mean_positions(x);
    }
    x.contiguous()?.apply_op1(MeanPositions)
}

struct MeanPositions;

/// 1/S as candle's affine map applies it (the factor cast to T).
fn inv<T: Real>(s: usize) -> T {
    T::from_f64(1.0 / s as f64)
}

impl CustomOp1 for MeanPositions {
    fn name(&self) -> &'static str {
        "nanhunt-mean-positions"
    }

    fn cpu_fwd(&self, st: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, s, d) = l.shape().dims3()?;
        with_real!(st, T => {
            let x = slice::<T>(st, l)?;
            let scale = inv::<T>(s);
            let mut y = vec![T::zero(); b * d];
            for (xb, yb) in x.chunks_exact(s * d).zip(y.chunks_exact_mut(d)) {
                for row in xb.chunks_exact(d) {
                    yb.iter_mut().zip(row).for_each(|(acc, &v)| *acc += v);
                }
                yb.iter_mut().for_each(|v| *v = *v * scale + T::zero());
            }
            Ok((T::to_cpu_storage_owned(y), Shape::from((b, d))))
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(
            &grad.contiguous()?,
            &MeanPositionsGrad,
        )?))
    }
}

/// (x (B, S, D), grad (B, D)) → dx: each position gets grad·(1/S) + 0.
struct MeanPositionsGrad;

impl CustomOp2 for MeanPositionsGrad {
    fn name(&self) -> &'static str {
        "nanhunt-mean-positions-grad"
    }

    fn cpu_fwd(
        &self,
        _s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, s, d) = l1.shape().dims3()?;
        with_real!(s2, T => {
            let g = slice::<T>(s2, l2)?;
            let scale = inv::<T>(s);
            let mut dx = Vec::with_capacity(l1.shape().elem_count());
            for gb in g.chunks_exact(d) {
                for _ in 0..s {
                    dx.extend(gb.iter().map(|&v| v * scale + T::zero()));
                }
            }
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}
