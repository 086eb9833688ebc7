//! Rotary position embedding (the "rotate half" layout) as one pass: for
//! each position t and pair i of a head, (x1, x2) ↦ (x1·cos - x2·sin,
//! x1·sin + x2·cos). Its backward is the rotation by the opposite angle,
//! the same op with sin negated. candle-nn's `rope` has no backward pass;
//! the composition of candle ops (`reference::rope`) takes eight nodes.

use super::reference;
use super::{fused_for, slice, widest, with_real, Real};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// x (B, S, H, hd), cos and sin (S, hd/2) → x rotated.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if !fused_for(x) || cos.dtype() != x.dtype() || sin.dtype() != x.dtype() {
        return reference::rope(x, cos, sin);
    }
    x.contiguous()?
        .apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope { heads: None })
}

/// x (B, S, heads·hd) with each head's pairs rotated: [`rope`] without a
/// reshape to (B, S, H, hd) and back (two graph nodes, each a zeroed
/// gradient buffer and an add in candle's backward pass).
pub fn rope_heads(x: &Tensor, heads: usize, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, s, d) = x.dims3()?;
    if !fused_for(x) || cos.dtype() != x.dtype() || sin.dtype() != x.dtype() {
        let split = x.reshape((b, s, heads, d / heads))?;
        return reference::rope(&split, cos, sin)?.reshape((b, s, d));
    }
    let op = Rope { heads: Some(heads) };
    x.contiguous()?
        .apply_op3(&cos.contiguous()?, &sin.contiguous()?, op)
}

/// The heads of a (B, S, heads·hd) input; `None`: (B, S, H, hd).
struct Rope {
    heads: Option<usize>,
}

impl Rope {
    /// (S, H, hd) of the input.
    fn dims(&self, l: &Layout) -> Result<(usize, usize, usize)> {
        match (self.heads, l.dims()) {
            (None, &[_, s, h, hd]) => Ok((s, h, hd)),
            (Some(h), &[_, s, d]) if h > 0 && d % h == 0 => Ok((s, h, d / h)),
            (heads, dims) => {
                candle_core::bail!("rope: input {dims:?} does not split into {heads:?} heads")
            }
        }
    }
}

impl Rope {
    #[inline(always)] // into `widest`'s build
    fn compute<T: Real>(x: &[T], cos: &[T], sin: &[T], dims: (usize, usize, usize)) -> Vec<T> {
        let (s, h, hd) = dims;
        let half = hd / 2;
        let mut y = vec![T::zero(); x.len()];
        for (r, (xr, yr)) in x.chunks_exact(hd).zip(y.chunks_exact_mut(hd)).enumerate() {
            // Rows are (b, t, head) in order.
            let t = (r / h) % s;
            let (c, sn) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            for i in 0..half {
                let (x1, x2) = (xr[i], xr[half + i]);
                yr[i] = x1 * c[i] - x2 * sn[i];
                yr[half + i] = x1 * sn[i] + x2 * c[i];
            }
        }
        y
    }
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "nanhunt-rope"
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
        let (s, h, hd) = self.dims(l1)?;
        if hd % 2 != 0 || l2.shape().elem_count() != s * hd / 2 {
            candle_core::bail!("rope: needs an even head width and (S, hd/2) tables");
        }
        with_real!(s1, T => {
            let (x, c, sn) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let y = widest(#[inline(always)] || Rope::compute(x, c, sn, (s, h, hd)));
            Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // The tables are constants: only the input gets a gradient.
        let dx =
            grad.contiguous()?
                .apply_op3_no_bwd(cos, &sin.neg()?, &Rope { heads: self.heads })?;
        Ok((Some(dx), None, None))
    }
}
