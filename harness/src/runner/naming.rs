//! Naming a failure: which stage produced it, what kind it is, with what
//! statistics. It reads a borrowed view of the session ([`Namer`]): the
//! case, the parameter names, the optimizer's state and the compute dtype.
//! The rules themselves are the shared checks ([`crate::checks`]) and the
//! traced analysis ([`crate::localize`]), which the guard calls too.

use super::Forward;
use crate::checks::{self, Updated};
use crate::error::Result;
use crate::finding::{Failure, FindingKind, Phase};
use crate::localize;
use crate::models::Tracer;
use crate::optim::Optimizer;
use crate::probe::{scan_all, TensorScan, TensorStats};
use crate::spec::Case;
use candle_core::Tensor;

/// What naming a failure needs of a session.
pub(super) struct Namer<'s> {
    pub case: &'s Case,
    /// Parameter names in creation order.
    pub names: &'s [String],
    pub optimizer: &'s Optimizer,
    /// Whether the compute dtype is a half precision (an infinity is then
    /// an overflow of the format).
    pub half: bool,
}

impl Namer<'_> {
    /// The loss stage, `loss.<name>`.
    pub fn loss_stage(&self) -> String {
        format!("loss.{}", self.case.loss.name())
    }

    /// The loss is not finite: blame the first non-finite forward stage
    /// (traced), else the model output, else the loss itself.
    pub fn forward_failure(
        &self,
        forward: &Forward,
        loss_value: f64,
        tracer: &Tracer,
    ) -> Result<Failure> {
        let records = tracer.records();
        if let Some(f) = localize::forward_producer(&records, &[&forward.input], self.half)? {
            return Ok(f);
        }
        let output = &forward.output;
        let out_scan = scan_all(&[output])?[0];
        if !out_scan.is_finite() {
            let mut f = checks::tensor_failure(
                &out_scan,
                self.half,
                Phase::Forward,
                "output".into(),
                "the model output is not finite",
                output,
            )?;
            // Without records, the kind is the first producer's: an
            // overflow stays an overflow after a later op made it NaN.
            if let Some(first) = localize::first_in_graph(output)? {
                if first.nan == 0 {
                    f.kind = FindingKind::of_non_finite(false, self.half);
                    f.detail = format!(
                        "{}; the first non-finite tensor in its graph holds {} infinities and no NaN: an overflow",
                        f.detail, first.inf
                    );
                }
            }
            return Ok(f);
        }
        let f = checks::loss(loss_value, self.half, &self.loss_stage(), || {
            format!("the loss is {loss_value} although the model output is finite")
        })
        .expect("a loss failure has a non-finite loss");
        Ok(f.with_stats(TensorStats::of_tensor(&forward.logits)?))
    }

    /// Gradient `i` is not finite: blame the stage whose backward produced
    /// it (traced), else the loss's backward, else the parameter's own gradient.
    pub fn backward_failure(
        &self,
        i: usize,
        scan: &TensorScan,
        grad: &Tensor,
        tracer: &Tracer,
        grad_store: &candle_core::backprop::GradStore,
    ) -> Result<Failure> {
        if tracer.enabled() {
            let records = tracer.records();
            let loss = self.loss_stage();
            if let Some(f) = localize::backward_producer(&records, grad_store, self.half, &loss)? {
                return Ok(f);
            }
        }
        checks::gradient_failure(&self.names[i], scan, self.half, grad)
    }

    /// Tensor `i` of the session's update tensors (parameters, then
    /// optimizer state) is not finite after the update.
    pub fn update_failure(&self, i: usize, scan: &TensorScan, tensor: &Tensor) -> Result<Failure> {
        let n = self.names.len();
        let which = if i < n {
            Updated::Param(&self.names[i])
        } else {
            let (p, kind, _) = self
                .optimizer
                .state_tensors()
                .nth(i - n)
                .expect("an update tensor is a parameter or a state tensor");
            Updated::State {
                kind,
                param: &self.names[p],
            }
        };
        checks::update_failure(which, scan, self.half, tensor)
    }
}
