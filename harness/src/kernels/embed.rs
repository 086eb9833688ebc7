//! The token embedding of a (B, S) batch of ids and the learned positions
//! added to it, as one op each. candle's composition is an index select,
//! a reshape to (B, S, D) and a broadcast add; backward, each of those is
//! a zero-filled gradient buffer of the whole activation and an add, and
//! the broadcast's gradient is a reduction over the batch with a division
//! and a remainder per element (2% of the large Transformer's step). The
//! bits are candle's: rows copied, one add forward; backward, each
//! table row's gradient summed in position order from 0 (`index_add`) and
//! each position's over the batch in order from 0.

use super::reference;
use super::{fused_for, slice, with_real};
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, WithDType,
};

/// The rows of `table` (V, D) at `ids` (u32, any shape) → (ids..., D).
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    if !fused_for(table) || ids.dtype() != DType::U32 || table.rank() != 2 {
        return reference::embedding(table, ids);
    }
    table.contiguous()?.apply_op2(&ids.contiguous()?, Embedding)
}

/// x (B, S, D) + pos (S, D), the positions broadcast over the batch.
pub fn add_positions(x: &Tensor, pos: &Tensor) -> Result<Tensor> {
    let fits = x.rank() == 3 && pos.rank() == 2 && x.dims()[1..] == *pos.dims();
    if !fused_for(x) || !fits || pos.dtype() != x.dtype() {
        return reference::add_positions(x, pos);
    }
    x.contiguous()?.apply_op2(&pos.contiguous()?, AddPositions)
}

/// Every id below `rows`, or an error naming the first that is not.
fn check_ids(ids: &[u32], rows: usize) -> Result<()> {
    match ids.iter().position(|&id| id as usize >= rows) {
        Some(at) => candle_core::bail!(
            "embedding: id {} at position {at} is out of range for a table of {rows} rows",
            ids[at]
        ),
        None => Ok(()),
    }
}

struct Embedding;

impl CustomOp2 for Embedding {
    fn name(&self) -> &'static str {
        "nanhunt-embedding"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, d) = l1.shape().dims2()?;
        let ids = slice::<u32>(s2, l2)?;
        check_ids(ids, rows)?;
        let mut dims = l2.dims().to_vec();
        dims.push(d);
        with_real!(s1, T => {
            let table = slice::<T>(s1, l1)?;
            let mut y = Vec::with_capacity(ids.len() * d);
            for &id in ids {
                let at = id as usize * d;
                y.extend_from_slice(&table[at..at + d]);
            }
            Ok((T::to_cpu_storage_owned(y), Shape::from(dims)))
        })
    }

    fn bwd(
        &self,
        table: &Tensor,
        ids: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let op = EmbeddingGrad {
            rows: table.dim(0)?,
        };
        let dtable = ids.apply_op2_no_bwd(&grad.contiguous()?, &op)?;
        Ok((Some(dtable), None))
    }
}

/// (ids, grad (ids..., D)) → the table's gradient (rows, D): each id's
/// gradient rows added into its row, in position order, onto zeros.
struct EmbeddingGrad {
    rows: usize,
}

impl CustomOp2 for EmbeddingGrad {
    fn name(&self) -> &'static str {
        "nanhunt-embedding-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ids = slice::<u32>(s1, l1)?;
        check_ids(ids, self.rows)?;
        let d = l2.dims().last().copied().unwrap_or(0);
        with_real!(s2, T => {
            let g = slice::<T>(s2, l2)?;
            let mut dtable = vec![T::zero(); self.rows * d];
            for (&id, gr) in ids.iter().zip(g.chunks_exact(d.max(1))) {
                let at = id as usize * d;
                for (acc, &v) in dtable[at..at + d].iter_mut().zip(gr) {
                    *acc += v;
                }
            }
            Ok((T::to_cpu_storage_owned(dtable), Shape::from((self.rows, d))))
        })
    }
}

struct AddPositions;

impl CustomOp2 for AddPositions {
    fn name(&self) -> &'static str {
        "nanhunt-add-positions"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let per_batch = l2.shape().elem_count().max(1);
        with_real!(s1, T => {
            let (x, pos) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let mut y = vec![T::zero(); x.len()];
            for (yb, xb) in y.chunks_exact_mut(per_batch).zip(x.chunks_exact(per_batch)) {
                for ((y, &x), &p) in yb.iter_mut().zip(xb).zip(pos) {
                    *y = x + p;
                }
            }
            Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        _x: &Tensor,
        pos: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let dpos = grad.apply_op1_no_bwd(&SumOverBatch)?;
        debug_assert_eq!(dpos.dims(), pos.dims());
        Ok((Some(grad), Some(dpos)))
    }
}

/// grad (B, S, D) → Σ over B, in batch order from 0 (`sum_keepdim(0)`'s
/// order), as (S, D).
struct SumOverBatch;

impl CustomOp1 for SumOverBatch {
    fn name(&self) -> &'static str {
        "nanhunt-sum-over-batch"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, seq, d) = l.shape().dims3()?;
        let per_batch = (seq * d).max(1);
        with_real!(s, T => {
            let g = slice::<T>(s, l)?;
            let mut sum = vec![T::zero(); seq * d];
            for gb in g.chunks_exact(per_batch) {
                for (acc, &v) in sum.iter_mut().zip(gb) {
                    *acc += v;
                }
            }
            Ok((T::to_cpu_storage_owned(sum), Shape::from((seq, d))))
        })
    }
}
