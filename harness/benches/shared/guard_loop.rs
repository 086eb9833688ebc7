//! The pieces of a user's small training loop that the guard bench and
//! `bench/tools/src/bin/guard_loop_alone.rs` both run, so that the two measure the
//! same loop: batches as candle tensors, the loss of a built-in model,
//! and the plain (unguarded) step.

use candle_core::{DType, Device, Tensor};
use nanhunt::data::{HostBatch, HostInput};
use nanhunt::guard::{Batch, GuardOptimizer, NanhuntOptimizer};
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::LossSpec;

/// A generated batch as the guard's named CPU tensors `x` and `t`.
pub fn to_batch(b: &HostBatch) -> Batch {
    let dev = Device::Cpu;
    let input = match &b.input {
        HostInput::Real { values, dims } => Tensor::from_slice(values, dims.as_slice(), &dev),
        HostInput::Tokens { ids, dims } => Tensor::from_slice(ids, dims.as_slice(), &dev),
    }
    .unwrap();
    let targets = Tensor::from_slice(&b.targets, (b.rows(), b.classes), &dev).unwrap();
    Batch::new([("x", input), ("t", targets)])
}

/// The model's loss on a batch (per-token outputs flattened to rows).
pub fn loss_of(model: &dyn Model, loss: &LossSpec, b: &Batch) -> candle_core::Result<Tensor> {
    let out = model.forward(b.get("x")?, &mut Tracer::off())?;
    let logits = match out.rank() {
        3 => out.flatten(0, 1)?,
        _ => out,
    };
    nanhunt::losses::loss(loss, &logits, b.get("t")?)
}

/// The plain loop's step after its loss: the value read back (for its
/// log), the backward pass and the optimizer's update.
pub fn plain_step(opt: &mut NanhuntOptimizer, value: Tensor) {
    let _ = value
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    opt.apply(&value.backward().unwrap()).unwrap();
}
