//! The two matrix products of multi-head attention, read and written in
//! the (B, S, D) layout the projections produce: scores = scale·q_h·k_hᵀ
//! per head, and context = p_h·v_h with the heads merged back. candle needs
//! the heads split into (B, H, S, d) copies, a transposed copy of k, a
//! separate scaling op, and the merged context transposed and copied back;
//! each of those is a node whose gradient is materialized and summed.
//!
//! Softmax (and the causal mask) stay separate ops between the two, where
//! the tracer records the scores and the probabilities.
//!
//! Grouped-query attention (fewer key/value heads than query heads) reads
//! each key/value head for every query head of its group in place: no
//! repeated copy of k and v, and their gradients summed over the group as
//! they are computed.

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
    grouped_attention_scores(q, k, (heads, heads), scale)
}

/// q (B, S, heads·hd), k (B, S, kv_heads·hd) → scores (B, heads, S, S):
/// query head h against key head h / (heads / kv_heads).
pub fn grouped_attention_scores(
    q: &Tensor,
    k: &Tensor,
    (heads, kv_heads): (usize, usize),
    scale: Option<f64>,
) -> Result<Tensor> {
    let groups = Groups::new(heads, kv_heads)?;
    if !fused_for(q) {
        let k = reference::repeat_kv(k, kv_heads, heads)?;
        return reference::attention_scores(q, &k, heads, scale);
    }
    let op = Scores {
        groups,
        scale: scale.unwrap_or(1.0),
    };
    q.contiguous()?.apply_op2(&k.contiguous()?, op)
}

/// probabilities (B, heads, S, S), v (B, S, D) → context (B, S, D).
pub fn attention_context(p: &Tensor, v: &Tensor, heads: usize) -> Result<Tensor> {
    grouped_attention_context(p, v, (heads, heads))
}

/// probabilities (B, heads, S, S), v (B, S, kv_heads·hd) → context
/// (B, S, heads·hd): query head h reads value head h / (heads / kv_heads).
pub fn grouped_attention_context(
    p: &Tensor,
    v: &Tensor,
    (heads, kv_heads): (usize, usize),
) -> Result<Tensor> {
    let groups = Groups::new(heads, kv_heads)?;
    if !fused_for(p) {
        let v = reference::repeat_kv(v, kv_heads, heads)?;
        return reference::attention_context(p, &v, heads);
    }
    p.contiguous()?
        .apply_op2(&v.contiguous()?, Context { groups })
}

/// Query heads and the key/value heads they share.
#[derive(Clone, Copy)]
struct Groups {
    heads: usize,
    kv_heads: usize,
}

impl Groups {
    fn new(heads: usize, kv_heads: usize) -> Result<Self> {
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            candle_core::bail!(
                "attention: {heads} query heads cannot share {kv_heads} key/value heads"
            );
        }
        Ok(Groups { heads, kv_heads })
    }

    /// The key/value head query head `h` reads.
    fn kv(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads)
    }

    /// Whether query head `h` is its group's first (it writes the group's
    /// key/value gradient; the others add to it).
    fn first(&self, h: usize) -> bool {
        h.is_multiple_of(self.heads / self.kv_heads)
    }

    /// (B, S, D, hd) of q and the key width, checked against k.
    fn shapes(&self, lq: &Layout, lk: &Layout) -> Result<(usize, usize, usize, usize, usize)> {
        let (b, s, d, hd) = bsd(lq, self.heads, "q")?;
        let dkv = self.kv_heads * hd;
        if lk.dims() != [b, s, dkv] {
            candle_core::bail!(
                "attention: k {:?} does not fit q {:?} with {} key/value heads",
                lk.dims(),
                lq.dims(),
                self.kv_heads
            );
        }
        Ok((b, s, d, hd, dkv))
    }
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
    groups: Groups,
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
        let g = self.groups;
        let (b, s, d, hd, dkv) = g.shapes(l1, l2)?;
        let nh = g.heads;
        with_real!(s1, T => {
            let (q, k) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let scale: T = real(self.scale);
            let mut out = vec![T::zero(); b * nh * s * s];
            for (bh, dst) in out.chunks_exact_mut(s * s).enumerate() {
                let (bi, h) = (bh / nh, bh % nh);
                let (qh, kh) = (head(q, (bi, h), (s, d, hd)), head_t(k, (bi, g.kv(h)), (s, dkv, hd)));
                matmul_strided((s, s, hd), qh, kh, dst, s, false, scale);
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
            groups: self.groups,
            scale: self.scale,
        };
        let packed = q.apply_op3_no_bwd(k, &grad.contiguous()?, &op)?;
        let [dq, dk] = unpack(&packed, [q.shape(), k.shape()])?;
        Ok((Some(dq), Some(dk)))
    }
}

/// (q, k, g) → [dq = scale·g·k | dk = scale·gᵀ·q], head by head; a
/// shared key head's gradient sums its group's.
struct ScoresGrad {
    groups: Groups,
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
        let g = self.groups;
        let (b, s, d, hd, dkv) = g.shapes(l1, l2)?;
        let nh = g.heads;
        with_real!(s1, T => {
            let (q, k, gr) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let scale: T = real(self.scale);
            let mut out = vec![T::zero(); b * s * d + b * s * dkv];
            let (dq, dk) = out.split_at_mut(b * s * d);
            for (bh, gm) in gr.chunks_exact(s * s).enumerate() {
                let (bi, h) = (bh / nh, bh % nh);
                let kv = g.kv(h);
                let gm_t = Mat { data: gm, rs: 1, cs: s };
                let at_q = bi * s * d + h * hd;
                let at_k = bi * s * dkv + kv * hd;
                matmul_strided((s, hd, s), Mat::rows(gm, s), head(k, (bi, kv), (s, dkv, hd)), &mut dq[at_q..], d, false, scale);
                matmul_strided((s, hd, s), gm_t, head(q, (bi, h), (s, d, hd)), &mut dk[at_k..], dkv, !g.first(h), scale);
            }
            flat(out)
        })
    }
}

struct Context {
    groups: Groups,
}

/// (B, S, D, hd, D_kv) of the context from the probabilities and v.
fn context_shapes(
    g: Groups,
    lp: &Layout,
    lv: &Layout,
) -> Result<(usize, usize, usize, usize, usize)> {
    let (b, s, dkv, hd) = bsd(lv, g.kv_heads, "v")?;
    if lp.dims() != [b, g.heads, s, s] {
        candle_core::bail!(
            "attention: probabilities {:?} do not fit v {:?}",
            lp.dims(),
            lv.dims()
        );
    }
    Ok((b, s, g.heads * hd, hd, dkv))
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
        let g = self.groups;
        let (b, s, d, hd, dkv) = context_shapes(g, l1, l2)?;
        let nh = g.heads;
        with_real!(s1, T => {
            let (p, v) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let mut out = vec![T::zero(); b * s * d];
            for (bh, pm) in p.chunks_exact(s * s).enumerate() {
                let (bi, h) = (bh / nh, bh % nh);
                let dst = &mut out[bi * s * d + h * hd..];
                let vh = head(v, (bi, g.kv(h)), (s, dkv, hd));
                matmul_strided((s, hd, s), Mat::rows(pm, s), vh, dst, d, false, T::one());
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
        let op = ContextGrad {
            groups: self.groups,
        };
        let packed = p.apply_op3_no_bwd(v, &grad.contiguous()?, &op)?;
        let [dp, dv] = unpack(&packed, [p.shape(), v.shape()])?;
        Ok((Some(dp), Some(dv)))
    }
}

/// (p, v, g) → [dp = g_h·v_hᵀ | dv = p_hᵀ·g_h], head by head; a shared
/// value head's gradient sums its group's.
struct ContextGrad {
    groups: Groups,
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
        let g = self.groups;
        let (b, s, d, hd, dkv) = context_shapes(g, l1, l2)?;
        let nh = g.heads;
        with_real!(s1, T => {
            let (p, v, gr) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let mut out = vec![T::zero(); b * nh * s * s + b * s * dkv];
            let (dp, dv) = out.split_at_mut(b * nh * s * s);
            for (bh, (pm, dpm)) in p.chunks_exact(s * s).zip(dp.chunks_exact_mut(s * s)).enumerate() {
                let (bi, h) = (bh / nh, bh % nh);
                let kv = g.kv(h);
                let pm_t = Mat { data: pm, rs: 1, cs: s };
                let gh = head(gr, (bi, h), (s, d, hd));
                matmul_strided((s, s, hd), gh, head_t(v, (bi, kv), (s, dkv, hd)), dpm, s, false, T::one());
                let at = bi * s * dkv + kv * hd;
                matmul_strided((s, hd, s), pm_t, gh, &mut dv[at..], dkv, !g.first(h), T::one());
            }
            flat(out)
        })
    }
}
