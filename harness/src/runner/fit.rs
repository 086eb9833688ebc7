//! Whether a case fits a binary's registered model, checked before its
//! first step: its input kind and shape, its outputs, its per-token form.
//! The model declares its own case, and a case of that shape (every case
//! a campaign draws of it) fits as declared. An input of another kind is
//! refused before any tensor op (a token batch handed to a model of real
//! inputs panics inside candle); another shape is tried once on a zero
//! batch of it, so that a shape or dtype mismatch candle would report
//! mid-run (or a panic) is refused as bad input naming the field. A model
//! handed to the library directly (a factory, no registration) is run as
//! it is: its errors are its own.

use super::Session;
use crate::error::{Error, Result};
use crate::models::Tracer;
use crate::spec::{InputSpec, ModelSpec};
use candle_core::{DType, Tensor};

/// Checks that the session's case fits its model (see the module docs).
pub(super) fn check(s: &Session) -> Result<()> {
    let ModelSpec::Custom(spec) = &s.case.model else {
        return Ok(());
    };
    let name = &spec.name;
    let Some(own) = crate::models::registered_for(&s.case).and_then(|m| match &m.case.model {
        ModelSpec::Custom(own) => Some(own),
        _ => None,
    }) else {
        return Ok(());
    };
    // The model's own shape (every case a campaign draws of it): it fits
    // as declared, and no forward is spent on it.
    if (&own.input, own.outputs, own.per_token) == (&spec.input, spec.outputs, spec.per_token) {
        return Ok(());
    }
    if kind(&own.input) != kind(&spec.input) {
        return Err(Error::invalid(
            "model.input.kind",
            format!(
                "the model `{name}` takes {} (its own case); this case gives {}",
                describe(&own.input),
                describe(&spec.input)
            ),
        ));
    }
    let mut dims = vec![s.case.batch_size];
    dims.extend(spec.input.dims());
    let dtype = match spec.input {
        InputSpec::Tokens { .. } => DType::U32,
        _ => s.compute,
    };
    let input = Tensor::zeros(dims, dtype, &s.device)?;
    let forward = || -> candle_core::Result<Tensor> {
        let model = s
            .factory
            .build_with(s.params.compute_builder(s.compute), &s.case.model, &s.knobs)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        model.forward(&input, &mut Tracer::off())
    };
    let refused = |why: String| {
        Error::invalid(
            "model.input",
            format!(
                "the model `{name}` does not take the case's input ({}): {why}",
                describe(&spec.input)
            ),
        )
    };
    let output = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(forward)) {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => match innermost(&e) {
            e if mismatch(e) => return Err(refused(e.to_string())),
            // Not the input's shape: the run reports it as it is.
            _ => return Ok(()),
        },
        Err(panic) => return Err(refused(panic_text(&panic))),
    };
    let per_token = output.rank() == 3;
    if per_token != spec.per_token && output.rank() >= 2 {
        return Err(Error::invalid(
            "model.per_token",
            format!(
                "the model `{name}` returns shape {:?}: {}",
                output.dims(),
                match per_token {
                    true => "one prediction per position; set `per_token: true`",
                    false => "one prediction per row; a per-token model returns (batch, positions, outputs)",
                }
            ),
        ));
    }
    let outputs = output.dims().last().copied().unwrap_or(0);
    if outputs != spec.outputs {
        return Err(Error::invalid(
            "model.outputs",
            format!(
                "the model `{name}` returns {outputs} outputs (shape {:?}); the case says {}",
                output.dims(),
                spec.outputs
            ),
        ));
    }
    Ok(())
}

/// The error under its context and backtrace.
fn innermost(e: &candle_core::Error) -> &candle_core::Error {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } | E::Context { inner, .. } | E::WithPath { inner, .. } => {
            innermost(inner)
        }
        e => e,
    }
}

/// Whether candle refused an input of the wrong shape or dtype.
fn mismatch(e: &candle_core::Error) -> bool {
    use candle_core::Error as E;
    matches!(
        e,
        E::UnexpectedDType { .. }
            | E::DTypeMismatchBinaryOp { .. }
            | E::DimOutOfRange { .. }
            | E::UnexpectedNumberOfDims { .. }
            | E::UnexpectedShape { .. }
            | E::ShapeMismatch { .. }
            | E::ShapeMismatchBinaryOp { .. }
            | E::ShapeMismatchCat { .. }
            | E::BroadcastIncompatibleShapes { .. }
            | E::NarrowInvalidArgs { .. }
            | E::InvalidIndex { .. }
    )
}

/// The kind of an input, without its sizes.
fn kind(input: &InputSpec) -> &'static str {
    match input {
        InputSpec::Image { .. } => "image",
        InputSpec::Tokens { .. } => "tokens",
        InputSpec::Sequence { .. } => "sequence",
        InputSpec::Vector { .. } => "vector",
    }
}

/// An input in words: "token ids (8 positions, vocabulary 32)".
fn describe(input: &InputSpec) -> String {
    match *input {
        InputSpec::Image {
            channels,
            height,
            width,
        } => format!("images of {channels}×{height}×{width}"),
        InputSpec::Tokens { seq_len, vocab } => {
            format!("token ids ({seq_len} positions, vocabulary {vocab})")
        }
        InputSpec::Sequence { seq_len, features } => {
            format!("sequences of {seq_len} positions × {features} features")
        }
        InputSpec::Vector { features } => format!("vectors of {features} features"),
    }
}

/// What a panic said.
fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "it panicked".to_string())
}
