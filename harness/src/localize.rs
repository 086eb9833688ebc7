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

use crate::error::Result;
use crate::models::Record;
use crate::probe::{scan_all, TensorScan};
use candle_core::backprop::GradStore;
use candle_core::Tensor;

/// The op kind of a stage, from its name: `block1.conv` → `conv`,
/// `layer0.attn.softmax` → `softmax`, `layer0.t3.gates` → `gates`.
pub fn op_of(stage: &str) -> Option<String> {
    let last = stage.rsplit('.').next()?;
    let trimmed = last.trim_end_matches(|c: char| c.is_ascii_digit() || c == ']' || c == '[');
    (!trimmed.is_empty()).then(|| trimmed.to_string())
}

/// What kind of computation a stage is, where code branches on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageKind {
    /// A normalization: built-in `bn`, `ln1`, `final_ln`; a user's
    /// `layer_norm`, `LayerNorm`, `rms_norm`, `norm2`, `group_norm`, ...
    Norm,
    Other,
}

impl StageKind {
    /// The kind of a stage's op (as [`op_of`] names it).
    pub fn of_op(op: &str) -> StageKind {
        let op = op.to_ascii_lowercase();
        if op == "bn" || op == "ln" || op.ends_with("_ln") || op.contains("norm") {
            StageKind::Norm
        } else {
            StageKind::Other
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_kinds_come_from_the_last_name_segment() {
        assert_eq!(op_of("block1.conv").as_deref(), Some("conv"));
        assert_eq!(op_of("layer0.attn.softmax").as_deref(), Some("softmax"));
        assert_eq!(op_of("layer0.t3.gates").as_deref(), Some("gates"));
        assert_eq!(op_of("augment[1].normalize").as_deref(), Some("normalize"));
        assert_eq!(op_of("embed").as_deref(), Some("embed"));
    }

    #[test]
    fn built_in_and_user_norm_layers_are_norm_stages() {
        for stage in [
            "block0.bn",
            "layer1.ln1",
            "final_ln",
            "encoder.layer_norm",
            "blocks[3].norm2",
            "model.RMSNorm",
        ] {
            let op = op_of(stage).unwrap();
            assert_eq!(StageKind::of_op(&op), StageKind::Norm, "{stage}");
        }
        for stage in ["block0.conv", "layer0.attn.softmax", "head.linear", "embed"] {
            let op = op_of(stage).unwrap();
            assert_eq!(StageKind::of_op(&op), StageKind::Other, "{stage}");
        }
    }
}
