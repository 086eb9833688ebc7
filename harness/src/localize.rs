//! First-producer localization over a traced step.
//!
//! The runner re-runs a failing step with the tracer on. Forward stages are
//! recorded in execution order, so the first non-finite record is the first
//! producer (its input, the previous record or the checked batch, was
//! finite). Backward goes the other way: walking the records from the last
//! to the first, the first whose *gradient* is non-finite received it from
//! the backward pass of the stage right after it (or of the loss, for the
//! last record), which is therefore the producer. Stages that only pass a
//! NaN along are never blamed.

use crate::checks;
use crate::error::Result;
use crate::finding::{Failure, OpKind, Phase, StageOp};
use crate::models::Record;
use crate::probe::{scan_all, TensorScan};
use candle_core::backprop::GradStore;
use candle_core::Tensor;

/// The first forward record that is not finite.
pub fn first_forward(records: &[Record]) -> Result<Option<(usize, TensorScan)>> {
    let outputs: Vec<&Tensor> = records.iter().map(|r| &r.output).collect();
    let scans = scan_all(&outputs)?;
    Ok(scans.into_iter().enumerate().find(|(_, s)| !s.is_finite()))
}

/// Without records: the scan of the first non-finite tensor in the graph
/// that made `output`, in execution order (candle's topological order,
/// reversed), so an overflow that a later op turned into NaN (∞ − ∞, 0·∞)
/// is still seen as the overflow it was. `None` when every node is finite.
pub fn first_in_graph(output: &Tensor) -> Result<Option<TensorScan>> {
    let nodes = output.sorted_nodes();
    let scans = scan_all(&nodes.iter().rev().copied().collect::<Vec<_>>())?;
    Ok(scans.into_iter().find(|s| !s.is_finite()))
}

/// A stage whose backward pass produced a non-finite gradient.
pub struct BackwardProducer {
    /// The stage whose backward op produced it (`None`: the loss's backward).
    pub stage: Option<String>,
    /// The indices in the records of the stage and of the receiver.
    pub stage_index: Option<usize>,
    pub receiver_index: usize,
    /// The record whose output gradient is the first non-finite one.
    pub receiver: String,
    pub grad: Tensor,
    pub scan: TensorScan,
}

impl BackwardProducer {
    /// The finding's detail, the producing stage being named `stage`.
    pub fn detail(&self, stage: &str) -> String {
        format!(
            "the backward pass of `{stage}` made the gradient of `{}` non-finite",
            self.receiver
        )
    }
}

/// Walks the records' gradients from the output back to the input.
pub fn first_backward(records: &[Record], grads: &GradStore) -> Result<Option<BackwardProducer>> {
    // (index, gradient) of the records that are on the path to the loss.
    let with_grad: Vec<(usize, &Tensor)> = records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| grads.get(r.grad_probe.as_tensor()).map(|g| (i, g)))
        .collect();
    let tensors: Vec<&Tensor> = with_grad.iter().map(|(_, g)| *g).collect();
    let scans = scan_all(&tensors)?;
    // Downstream first: the last record's gradient is computed first.
    let mut downstream: Option<usize> = None;
    for ((i, g), scan) in with_grad.iter().zip(scans).rev() {
        if !scan.is_finite() {
            return Ok(Some(BackwardProducer {
                stage: downstream.map(|d| records[d].name.clone()),
                stage_index: downstream,
                receiver_index: *i,
                receiver: records[*i].name.clone(),
                grad: (*g).clone(),
                scan,
            }));
        }
        downstream = Some(*i);
    }
    Ok(None)
}

/// The first producer of a traced step's forward failure: the first
/// non-finite record, with the explanation of what it computed; `None`
/// when every record is finite. `inputs` are what the first record may
/// have read (the model's input, or a user's batch).
pub fn forward_producer(
    records: &[Record],
    inputs: &[&Tensor],
    half: bool,
) -> Result<Option<Failure>> {
    let Some((i, scan)) = first_forward(records)? else {
        return Ok(None);
    };
    let r = &records[i];
    let f = checks::tensor_failure(
        &scan,
        half,
        Phase::Forward,
        r.name.clone(),
        &format!(
            "stage `{}` produced non-finite values from finite inputs",
            r.name
        ),
        &r.output,
    )?;
    let e = crate::explain::forward(records, i, inputs)?;
    Ok(Some(f.with_op(r.stage_op()).with_explanation(e)))
}

/// The producer of a traced step's first non-finite gradient: the stage
/// whose backward pass made it, with its explanation, or the loss's
/// backward (`loss_stage`) for the last record's; `None` when every
/// recorded gradient is finite.
pub fn backward_producer(
    records: &[Record],
    grads: &GradStore,
    half: bool,
    loss_stage: &str,
) -> Result<Option<Failure>> {
    let Some(p) = first_backward(records, grads)? else {
        return Ok(None);
    };
    let (stage, op) = match p.stage_index {
        Some(s) => (records[s].name.clone(), records[s].stage_op()),
        None => (
            loss_stage.to_string(),
            Some(StageOp::declared(OpKind::Loss)),
        ),
    };
    let f = checks::tensor_failure(
        &p.scan,
        half,
        Phase::Backward,
        stage.clone(),
        &p.detail(&stage),
        &p.grad,
    )?
    .with_op(op);
    Ok(Some(match p.stage_index {
        Some(s) => f.with_explanation(crate::explain::backward(
            records,
            s,
            p.receiver_index,
            &p.grad,
        )?),
        None => f,
    }))
}
