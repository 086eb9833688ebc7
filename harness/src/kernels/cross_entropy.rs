//! Cross-entropy of logits against dense target distributions,
//! mean over rows of -Σ t·log_softmax(z), as one op each way: the
//! reference is eleven candle ops forward and their backward ops, each a
//! pass, an allocation and a zero-filled gradient buffer (about 1 ms of
//! the decoder's step over 1024 rows × 64 classes).
//!
//! Unlike the other kernels this one gives the reference composition's
//! bits, forward and backward: the same max, candle's exp and ln, candle's
//! own row sums (`VecOps::vec_reduce_sum`, whose f32 order is its AVX
//! lanes), and every accumulation of candle's backward pass into a zeroed
//! gradient (`0 + x`, `0 - x`) written out. The loss is in every step of
//! every cross-entropy case, so this keeps every trajectory, reproducer and
//! snapshot what it was; `tests` compares the bits.

use super::reference;
use super::{fused_for, slice, with_real, Real};
use candle_core::cpu::kernels::VecOps;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType};
use std::sync::{Arc, OnceLock};

/// -mean_i Σ_j t_ij · log_softmax(z_i)_j for z, t of shape (rows, classes).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let fits = logits.rank() == 2
        && logits.shape() == targets.shape()
        && logits.dtype() == targets.dtype()
        && logits.elem_count() > 0;
    if !fused_for(logits) || !fits {
        return reference::cross_entropy(logits, targets);
    }
    let op = CrossEntropy {
        saved: Arc::default(),
    };
    logits.contiguous()?.apply_op2(&targets.contiguous()?, op)
}

/// What the forward pass keeps for the backward pass, as candle's graph
/// keeps the exp and the row sums of the composition.
struct Rows<T> {
    classes: usize,
    /// e^(z - max), row by row.
    exps: Vec<T>,
    /// Σ_j e^(z_ij - max_i).
    sums: Vec<T>,
    /// The row max and ln(sum): log_softmax is (z - max) - lse.
    maxes: Vec<T>,
    lses: Vec<T>,
}

enum Saved {
    F32(Rows<f32>),
    F64(Rows<f64>),
}

/// The kernel's floats with candle's row sums and their saved rows.
trait Float: Real + VecOps {
    fn save(rows: Rows<Self>) -> Saved;
    fn saved(saved: &Saved) -> Option<&Rows<Self>>;
}

impl Float for f32 {
    fn save(rows: Rows<Self>) -> Saved {
        Saved::F32(rows)
    }
    fn saved(saved: &Saved) -> Option<&Rows<Self>> {
        match saved {
            Saved::F32(rows) => Some(rows),
            Saved::F64(_) => None,
        }
    }
}

impl Float for f64 {
    fn save(rows: Rows<Self>) -> Saved {
        Saved::F64(rows)
    }
    fn saved(saved: &Saved) -> Option<&Rows<Self>> {
        match saved {
            Saved::F64(rows) => Some(rows),
            Saved::F32(_) => None,
        }
    }
}

/// Σ xs in candle's order (its `sum_keepdim` over a contiguous last dim).
fn candle_sum<T: Float>(xs: &[T]) -> T {
    let mut sum = T::zero();
    // SAFETY: `xs` holds `xs.len()` elements and `sum` is a valid place.
    unsafe { T::vec_reduce_sum(xs.as_ptr(), &mut sum, xs.len()) };
    sum
}

/// candle's max over a row: the first element, replaced by each larger one
/// (so a NaN in front stays, a later one is passed over).
fn candle_max<T: Float>(row: &[T]) -> T {
    row.iter()
        .fold(row[0], |max, &v| if max < v { v } else { max })
}

/// 1/rows as `mean_all` applies it (an affine map with factors cast to T).
fn inv_rows<T: Float>(rows: usize) -> T {
    T::from_f64(1.0 / rows as f64)
}

/// The loss and the rows the backward pass needs.
fn forward<T: Float>(z: &[T], t: &[T], classes: usize) -> (T, Rows<T>) {
    let rows = z.len() / classes;
    let zero = T::zero();
    let mut saved = Rows {
        classes,
        exps: vec![zero; z.len()],
        sums: Vec::with_capacity(rows),
        maxes: Vec::with_capacity(rows),
        lses: Vec::with_capacity(rows),
    };
    let mut products = vec![zero; classes];
    let mut negated = Vec::with_capacity(rows);
    let exps = saved.exps.chunks_exact_mut(classes);
    for ((zr, tr), er) in z
        .chunks_exact(classes)
        .zip(t.chunks_exact(classes))
        .zip(exps)
    {
        let max = candle_max(zr);
        for (e, &v) in er.iter_mut().zip(zr) {
            *e = num_traits::Float::exp(v - max);
        }
        let sum = candle_sum(er);
        let lse = num_traits::Float::ln(sum);
        for ((p, &v), &target) in products.iter_mut().zip(zr).zip(tr) {
            *p = target * ((v - max) - lse);
        }
        negated.push(-candle_sum(&products));
        saved.sums.push(sum);
        saved.maxes.push(max);
        saved.lses.push(lse);
    }
    // mean_all: the sum over rows, then the affine map x·(1/rows) + 0.
    let loss = candle_sum(&negated) * inv_rows::<T>(rows) + zero;
    (loss, saved)
}

struct CrossEntropy {
    saved: Arc<OnceLock<Saved>>,
}

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "nanhunt-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let classes = super::last_dim(l1, "cross_entropy")?;
        with_real!(s1, T => {
            let (z, t) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let (loss, rows) = forward::<T>(z, t, classes);
            if self.saved.set(T::save(rows)).is_err() {
                candle_core::bail!("cross_entropy: one op instance ran forward twice");
            }
            Ok((T::to_cpu_storage_owned(vec![loss]), Shape::from(())))
        })
    }

    fn bwd(
        &self,
        z: &Tensor,
        t: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let with_targets = t.track_op();
        let op = CrossEntropyGrad {
            saved: self.saved.clone(),
            with_targets,
        };
        let packed = z.apply_op3_no_bwd(t, &grad.contiguous()?, &op)?;
        if with_targets {
            let [dz, dt] = super::unpack(&packed, [z.shape(), t.shape()])?;
            Ok((Some(dz), Some(dt)))
        } else {
            Ok((Some(packed.reshape(z.shape())?), None))
        }
    }
}

/// (z, t, grad of the loss) → dz, or [dz | dt] when the targets need
/// theirs: candle's backward pass through the composition, step by step.
struct CrossEntropyGrad {
    saved: Arc<OnceLock<Saved>>,
    with_targets: bool,
}

/// dz (and dt) of the composition for an upstream gradient `g`. Each line
/// is one node of the reference's backward pass; `0 + x` and `0 - x` are
/// its accumulations into zeroed gradients (they turn −0 into +0).
fn backward<T: Float>(z: &[T], t: &[T], g: T, saved: &Rows<T>, with_targets: bool) -> Vec<T> {
    let classes = saved.classes;
    let zero = T::zero();
    // The affine map, the sum over rows, the negation and the row sum.
    let d_row_sums = zero - (zero + (g * inv_rows::<T>(t.len() / classes) + zero));
    let d_products = zero + d_row_sums;
    let mut out = vec![zero; if with_targets { 2 * z.len() } else { z.len() }];
    let (dz, dt) = out.split_at_mut(z.len());
    let mut d_lse_terms = vec![zero; classes];
    let rows = dz.chunks_exact_mut(classes).zip(t.chunks_exact(classes));
    for (i, (dzr, tr)) in rows.enumerate() {
        let er = &saved.exps[i * classes..][..classes];
        // t · log_softmax: the gradient reaching log_softmax; log_softmax =
        // shifted - lse broadcast: lse's gradient is Σ (0 - that).
        for (d, &target) in d_lse_terms.iter_mut().zip(tr) {
            *d = zero - (zero + d_products * target);
        }
        let d_lse = zero + candle_sum(&d_lse_terms);
        // ln, then the row sum of the exps, broadcast back to each exp.
        let d_exp = zero + (zero + d_lse / saved.sums[i]);
        for ((d, &target), &e) in dzr.iter_mut().zip(tr).zip(er) {
            *d = (zero + (zero + d_products * target)) + d_exp * e;
        }
    }
    if with_targets {
        let rows = dt.chunks_exact_mut(classes).zip(z.chunks_exact(classes));
        for (i, (dtr, zr)) in rows.enumerate() {
            let (max, lse) = (saved.maxes[i], saved.lses[i]);
            for (d, &v) in dtr.iter_mut().zip(zr) {
                *d = zero + d_products * ((v - max) - lse);
            }
        }
    }
    out
}

impl CustomOp3 for CrossEntropyGrad {
    fn name(&self) -> &'static str {
        "nanhunt-cross-entropy-grad"
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
        let Some(saved) = self.saved.get() else {
            candle_core::bail!("cross_entropy: backward before forward");
        };
        with_real!(s1, T => {
            let (z, t, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?, slice::<T>(s3, l3)?);
            let Some(rows) = T::saved(saved) else {
                candle_core::bail!("cross_entropy: backward in another dtype than forward");
            };
            let Some(&g) = g.first() else {
                candle_core::bail!("cross_entropy: an empty gradient for the loss");
            };
            super::flat(backward::<T>(z, t, g, rows, self.with_targets))
        })
    }
}
