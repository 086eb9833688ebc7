//! The records of a traced re-run as a graph: which record made each
//! tensor an op read (by the tensor's id: a record's output is the very
//! tensor the code goes on with), which ops read a record, and what kinds
//! of non-finite values each holds. Ops of `#[nanhunt::instrument]`ed
//! code know what they read; a stage recorded by name does not, and is
//! taken to read the record before it (the convention of records made in
//! order), marked as a guess.

use super::tracer::{Operand, Record};
use crate::error::Result;
use crate::probe::scan_all;
use candle_core::backprop::GradStore;
use candle_core::{Tensor, TensorId};
use std::collections::HashMap;

/// What an op read: the tensor, and the record that made it (if one did).
#[derive(Clone, Copy, Debug)]
pub struct Read<'r> {
    /// The tensor.
    pub tensor: &'r Tensor,
    /// The record that made it, if one did.
    pub from: Option<usize>,
}

/// The non-finite values a tensor holds, by class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NonFinite {
    /// NaN values.
    pub nan: bool,
    /// +inf values.
    pub pos_inf: bool,
    /// −inf values.
    pub neg_inf: bool,
}

impl NonFinite {
    /// The classes `t` holds.
    pub fn of(t: &Tensor) -> Result<NonFinite> {
        let scan = scan_all(&[t])?[0];
        if scan.is_finite() {
            return Ok(NonFinite::default());
        }
        let (lo, hi) = if scan.inf > 0 {
            let v = t
                .flatten_all()?
                .to_dtype(candle_core::DType::F64)?
                .to_vec1::<f64>()?;
            (v.contains(&f64::NEG_INFINITY), v.contains(&f64::INFINITY))
        } else {
            (false, false)
        };
        Ok(NonFinite {
            nan: scan.nan > 0,
            pos_inf: hi,
            neg_inf: lo,
        })
    }

    /// Whether it holds any.
    pub fn any(self) -> bool {
        self.nan || self.pos_inf || self.neg_inf
    }

    /// The classes of `self` that `inputs` hold none of: what an op made.
    pub fn new_over(self, inputs: NonFinite) -> NonFinite {
        NonFinite {
            nan: self.nan && !inputs.nan,
            pos_inf: self.pos_inf && !inputs.pos_inf,
            neg_inf: self.neg_inf && !inputs.neg_inf,
        }
    }

    /// The classes either holds.
    pub fn union(self, o: NonFinite) -> NonFinite {
        NonFinite {
            nan: self.nan || o.nan,
            pos_inf: self.pos_inf || o.pos_inf,
            neg_inf: self.neg_inf || o.neg_inf,
        }
    }
}

/// The records as a graph.
pub struct OpGraph<'r> {
    /// The step's records, in execution order.
    pub records: &'r [Record],
    made_by: HashMap<TensorId, usize>,
}

impl<'r> OpGraph<'r> {
    /// The graph of `records`.
    pub fn new(records: &'r [Record]) -> OpGraph<'r> {
        let made_by = records
            .iter()
            .enumerate()
            .map(|(i, r)| (r.output.id(), i))
            .collect();
        OpGraph { records, made_by }
    }

    /// Whether any record is an instrumented op.
    pub fn has_ops(&self) -> bool {
        self.records.iter().any(|r| r.site.is_some())
    }

    /// The record that made `t`, if one did.
    pub fn made(&self, t: &Tensor) -> Option<usize> {
        self.made_by.get(&t.id()).copied()
    }

    /// What record `i` read: an op's tensors, or, for a stage recorded by
    /// name, the record before it (`None` for the first: the model's input).
    pub fn reads(&self, i: usize) -> Vec<Read<'r>> {
        let r = &self.records[i];
        if r.site.is_some() {
            return Operand::tensors(&r.inputs)
                .map(|t| Read {
                    tensor: t,
                    from: self.made(t),
                })
                .collect();
        }
        match i.checked_sub(1) {
            Some(j) => vec![Read {
                tensor: &self.records[j].output,
                from: Some(j),
            }],
            None => Vec::new(),
        }
    }

    /// The numbers an op read (its literal and `f64` operands).
    pub fn scalars(&self, i: usize) -> Vec<f64> {
        Operand::scalars(&self.records[i].inputs).collect()
    }

    /// The ops that read record `j`'s output, in execution order.
    pub fn consumers(&self, j: usize) -> Vec<usize> {
        let id = self.records[j].output.id();
        (j + 1..self.records.len())
            .filter(|&i| {
                let r = &self.records[i];
                match r.site {
                    Some(_) => Operand::tensors(&r.inputs).any(|t| t.id() == id),
                    None => i == j + 1,
                }
            })
            .collect()
    }

    /// The op record `j` passes through to: a stage recorded by name whose
    /// output is, bit for bit, the record before it (`trace(name, op)`)
    /// stands for that op; any other record for itself.
    pub fn source(&self, j: usize) -> Result<usize> {
        let r = &self.records[j];
        if r.site.is_some() || j == 0 {
            return Ok(j);
        }
        let before = &self.records[j - 1];
        if before.site.is_some() && same_values(&before.output, &r.output)? {
            return self.source(j - 1);
        }
        Ok(j)
    }

    /// The gradient of record `j`'s output, where the backward pass reached
    /// it. A view carries no probe: its input's gradient stands for its own
    /// (a view moves values, and their gradients, without computing any).
    pub fn grad<'g>(&self, grads: &'g GradStore, j: usize) -> Option<&'g Tensor> {
        let r = &self.records[j];
        if r.site
            .as_ref()
            .is_some_and(|s| s.kind == crate::finding::OpKind::View)
        {
            let read = self.reads(j).into_iter().next()?;
            return self.grad_of_read(grads, &read);
        }
        grads.get(r.grad_probe.as_tensor())
    }

    /// The gradient of a tensor an op read: a record's output's, or a
    /// trainable variable's own.
    pub fn grad_of_read<'g>(&self, grads: &'g GradStore, read: &Read) -> Option<&'g Tensor> {
        match read.from {
            Some(j) => self.grad(grads, j),
            None => grads.get(read.tensor),
        }
    }

    /// The last record at or after `from` whose output holds the values of
    /// `t` bit for bit (NaN equal to NaN): where a tensor copied out of the
    /// records (an updated parameter) was made.
    pub fn holding(&self, t: &Tensor, from: usize) -> Result<Option<usize>> {
        for j in (from..self.records.len()).rev() {
            if same_values(&self.records[j].output, t)? {
                return Ok(Some(j));
            }
        }
        Ok(None)
    }

    /// Every record `i` depends on through what the records read, and `i`.
    pub fn ancestors(&self, i: usize) -> Vec<bool> {
        let mut seen = vec![false; self.records.len()];
        let mut stack = vec![i];
        while let Some(k) = stack.pop() {
            if std::mem::replace(&mut seen[k], true) {
                continue;
            }
            stack.extend(self.reads(k).iter().filter_map(|r| r.from));
        }
        seen
    }
}

/// Whether two tensors hold the same values (NaN equal to NaN).
fn same_values(a: &Tensor, b: &Tensor) -> Result<bool> {
    if a.dims() != b.dims() || a.dtype() != b.dtype() {
        return Ok(false);
    }
    let f = |t: &Tensor| -> Result<Vec<f64>> {
        Ok(t.flatten_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1::<f64>()?)
    };
    Ok(f(a)?
        .iter()
        .zip(f(b)?)
        .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())))
}
