//! The two matrix products of multi-head attention, read and written in
//! the (B, S, D) layout the projections produce: scores = scale·q_h·k_hᵀ
//! per head, and context = p_h·v_h with the heads merged back. candle needs
//! the heads split into (B, H, S, d) copies, a transposed copy of k, a
//! separate scaling op, and the merged context transposed and copied back;
//! each of those is a node whose gradient is materialized and summed.
//!
//! Softmax (and the causal mask) stay separate ops between the two, where
//! the tracer records the scores and the probabilities.

use super::gemm::{matmul_strided, Mat};
use super::reference;
use super::{flat, fused_for, real, slice, unpack, with_real};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

/// q, k (B, S, D) → scores (B, heads, S, S), times `scale` when given.
pub fn attention_scores(
    q: &Tensor,
    k: &Tensor,
    heads: usize,
    scale: Option<f64>,
) -> Result<Tensor> {
    if !fused_for(q) {
        return reference::attention_scores(q, k, heads, scale);
    }
    let op = Scores {
        heads,
        scale: scale.unwrap_or(1.0),
    };
    q.contiguous()?.apply_op2(&k.contiguous()?, op)
}

/// probabilities (B, heads, S, S), v (B, S, D) → context (B, S, D).
pub fn attention_context(p: &Tensor, v: &Tensor, heads: usize) -> Result<Tensor> {
    if !fused_for(p) {
        return reference::attention_context(p, v, heads);
    }
    p.contiguous()?
        .apply_op2(&v.contiguous()?, Context { heads })
}

/// (B, S, D) and the head width of a layout.
fn bsd(l: &Layout, heads: usize, what: &str) -> Result<(usize, usize, usize, usize)> {
    match *l.dims() {
        [b, s, d] if heads > 0 && d % heads == 0 => Ok((b, s, d, d / heads)),
        ref other => candle_core::bail!(
            "attention: {what} must be (B, S, D) with D divisible by {heads} heads, got {other:?}"
        ),
    }
}

/// Head `h` of batch `b` of a (B, S, D) matrix: S rows of `hd` columns.
fn head<T>(m: &[T], (b, h): (usize, usize), (s, d, hd): (usize, usize, usize)) -> Mat<'_, T> {
    Mat {
        data: &m[b * s * d + h * hd..],
        rs: d,
        cs: 1,
    }
}

/// The same head, transposed (hd rows of S columns).
fn head_t<T>(m: &[T], (b, h): (usize, usize), (s, d, hd): (usize, usize, usize)) -> Mat<'_, T> {
    Mat {
        data: &m[b * s * d + h * hd..],
        rs: 1,
        cs: d,
    }
}

struct Scores {
    heads: usize,
    scale: f64,
}

impl CustomOp2 for Scores {
    fn name(&self) -> &'static str {
        "nanhunt-attention-scores"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, s, d, hd) = bsd(l1, self.heads, "q")?;
        if l2.dims() != l1.dims() {
            candle_core::bail!(
                "attention: k {:?} differs from q {:?}",
                l2.dims(),
                l1.dims()
            );
        }
        let nh = self.heads;
        with_real!(s1, T => {
            let (q, k) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let scale: T = real(self.scale);
            let mut out = vec![T::zero(); b * nh * s * s];
            for (bh, dst) in out.chunks_exact_mut(s * s).enumerate() {
                let at = (bh / nh, bh % nh);
                let geo = (s, d, hd);
                matmul_strided((s, s, hd), head(q, at, geo), head_t(k, at, geo), dst, s, false, scale);
            }
            Ok((T::to_cpu_storage_owned(out), Shape::from((b, nh, s, s))))
        })
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let op = ScoresGrad {
            heads: self.heads,
            scale: self.scale,
        };
        let packed = q.apply_op3_no_bwd(k, &grad.contiguous()?, &op)?;
        let [dq, dk] = unpack(&packed, [q.shape(), k.shape()])?;
        Ok((Some(dq), Some(dk)))
    }
}

/// (q, k, g) → [dq = scale·g·k | dk = scale·gᵀ·q], head by head.
struct ScoresGrad {
    heads: usize,
    scale: f64,
}

impl CustomOp3 for ScoresGrad {
    fn name(&self) -> &'static str {
        "nanhunt-attention-scores-grad"
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
        let (b, s, d, hd) = bsd(l1, self.heads, "q")?;
        let nh = self.heads;
        with_real!(s1, T => {
            let (q, k, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let scale: T = real(self.scale);
            let mut out = vec![T::zero(); 2 * b * s * d];
            let (dq, dk) = out.split_at_mut(b * s * d);
            let geo = (s, d, hd);
            for (bh, gm) in g.chunks_exact(s * s).enumerate() {
                let (bi, h) = (bh / nh, bh % nh);
                let at = bi * s * d + h * hd;
                let gm_t = Mat { data: gm, rs: 1, cs: s };
                matmul_strided((s, hd, s), Mat::rows(gm, s), head(k, (bi, h), geo), &mut dq[at..], d, false, scale);
                matmul_strided((s, hd, s), gm_t, head(q, (bi, h), geo), &mut dk[at..], d, false, scale);
            }
            flat(out)
        })
    }
}

struct Context {
    heads: usize,
}

impl CustomOp2 for Context {
    fn name(&self) -> &'static str {
        "nanhunt-attention-context"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, s, d, hd) = bsd(l2, self.heads, "v")?;
        let nh = self.heads;
        if l1.dims() != [b, nh, s, s] {
            candle_core::bail!(
                "attention: probabilities {:?} do not fit v {:?}",
                l1.dims(),
                l2.dims()
            );
        }
        with_real!(s1, T => {
            let (p, v) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let mut out = vec![T::zero(); b * s * d];
            for (bh, pm) in p.chunks_exact(s * s).enumerate() {
                let (bi, h) = (bh / nh, bh % nh);
                let dst = &mut out[bi * s * d + h * hd..];
                matmul_strided((s, hd, s), Mat::rows(pm, s), head(v, (bi, h), (s, d, hd)), dst, d, false, T::one());
            }
            Ok((T::to_cpu_storage_owned(out), Shape::from((b, s, d))))
        })
    }

    fn bwd(
        &self,
        p: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let op = ContextGrad { heads: self.heads };
        let packed = p.apply_op3_no_bwd(v, &grad.contiguous()?, &op)?;
        let [dp, dv] = unpack(&packed, [p.shape(), v.shape()])?;
        Ok((Some(dp), Some(dv)))
    }
}

/// (p, v, g) → [dp = g_h·v_hᵀ | dv = p_hᵀ·g_h], head by head.
struct ContextGrad {
    heads: usize,
}

impl CustomOp3 for ContextGrad {
    fn name(&self) -> &'static str {
        "nanhunt-attention-context-grad"
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
        let (b, s, d, hd) = bsd(l2, self.heads, "v")?;
        let nh = self.heads;
        with_real!(s1, T => {
            let (p, v, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let mut out = vec![T::zero(); b * nh * s * s + b * s * d];
            let (dp, dv) = out.split_at_mut(b * nh * s * s);
            let geo = (s, d, hd);
            for (bh, (pm, dpm)) in p.chunks_exact(s * s).zip(dp.chunks_exact_mut(s * s)).enumerate() {
                let (bi, h) = (bh / nh, bh % nh);
                let pm_t = Mat { data: pm, rs: 1, cs: s };
                matmul_strided((s, s, hd), head(g, (bi, h), geo), head_t(v, (bi, h), geo), dpm, s, false, T::one());
                let at = bi * s * d + h * hd;
                matmul_strided((s, hd, s), pm_t, head(g, (bi, h), geo), &mut dv[at..], d, false, T::one());
            }
            flat(out)
        })
    }
}
