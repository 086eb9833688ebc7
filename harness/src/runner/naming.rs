//! Naming a failure: which stage produced it, what kind it is, with what
//! statistics. It reads a borrowed view of the session ([`Namer`]): the
//! case, the parameter names, the optimizer's state and the compute dtype.

use super::{Failure, Forward};
use crate::error::Result;
use crate::localize;
use crate::models::Tracer;
use crate::optim::Optimizer;
use crate::outcome::{FindingKind, Phase};
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
    /// The loss is not finite: blame the first non-finite forward stage
    /// (traced), else the model output, else the loss itself.
    pub fn forward_failure(
        &self,
        forward: &Forward,
        loss_value: f64,
        tracer: &Tracer,
    ) -> Result<Failure> {
        let (output, logits) = (&forward.output, &forward.logits);
        let records = tracer.records();
        if let Some((i, scan)) = localize::first_forward(&records)? {
            let r = &records[i];
            let mut f = self.tensor_failure(
                &scan,
                Phase::Forward,
                r.name.clone(),
                format!(
                    "stage `{}` produced non-finite values from finite inputs",
                    r.name
                ),
                &r.output,
            )?;
            f.op = localize::op_of(&r.name);
            let e = crate::explain::forward(&records, i, Some(&forward.input))?;
            f.explanation = Some(Box::new(e));
            return Ok(f);
        }
        let out_scan = scan_all(&[output])?[0];
        if !out_scan.is_finite() {
            let mut f = self.tensor_failure(
                &out_scan,
                Phase::Forward,
                "output".into(),
                "the model output is not finite".into(),
                output,
            )?;
            // Without records, the kind is the first producer's: an
            // overflow stays an overflow after a later op made it NaN.
            if let Some(first) = localize::first_in_graph(output)? {
                if first.nan == 0 {
                    f.kind = self.kind_of_value(f64::INFINITY);
                    f.detail = format!(
                        "{}; the first non-finite tensor in its graph holds {} infinities and no NaN: an overflow",
                        f.detail, first.inf
                    );
                }
            }
            return Ok(f);
        }
        Ok(Failure {
            op: Some(self.case.loss.name().to_string()),
            stats: Some(TensorStats::of_tensor(logits)?),
            ..Failure::new(
                self.kind_of_value(loss_value),
                Phase::Loss,
                format!("loss.{}", self.case.loss.name()),
                format!("the loss is {loss_value} although the model output is finite"),
            )
        })
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
            if let Some(p) = localize::first_backward(&records, grad_store)? {
                let (stage, op) = match &p.stage {
                    Some(s) => (s.clone(), localize::op_of(s)),
                    None => (
                        format!("loss.{}", self.case.loss.name()),
                        Some(self.case.loss.name().to_string()),
                    ),
                };
                let mut f = self.tensor_failure(
                    &p.scan,
                    Phase::Backward,
                    stage.clone(),
                    p.detail(&stage),
                    &p.grad,
                )?;
                f.op = op;
                if let Some(s) = p.stage_index {
                    let e = crate::explain::backward(&records, s, p.receiver_index, &p.grad)?;
                    f.explanation = Some(Box::new(e));
                }
                return Ok(f);
            }
        }
        self.tensor_failure(
            scan,
            Phase::Backward,
            format!("grad.{}", self.names[i]),
            format!("the gradient of `{}` is not finite", self.names[i]),
            grad,
        )
    }

    /// Tensor `i` of the session's update tensors (parameters, then optimizer state) is not finite after the update.
    pub fn update_failure(&self, i: usize, scan: &TensorScan, tensor: &Tensor) -> Result<Failure> {
        let state: Vec<(usize, &'static str, &Tensor)> = self.optimizer.state_tensors().collect();
        let (stage, what) = if i < self.names.len() {
            let name = &self.names[i];
            (format!("param.{name}"), format!("parameter `{name}`"))
        } else {
            let (p, kind, _) = state[i - self.names.len()];
            let name = format!("{kind}.{}", self.names[p]);
            (
                format!("optimizer.{name}"),
                format!("optimizer state `{name}`"),
            )
        };
        self.tensor_failure(
            scan,
            Phase::Update,
            stage,
            format!("{what} is not finite after the update"),
            tensor,
        )
    }

    pub fn kind_of_value(&self, v: f64) -> FindingKind {
        if v.is_nan() {
            FindingKind::Nan
        } else if self.half {
            // In half precision an infinity is an overflow of the format.
            FindingKind::Overflow
        } else {
            FindingKind::Inf
        }
    }

    pub fn tensor_failure(
        &self,
        scan: &TensorScan,
        phase: Phase,
        stage: String,
        detail: String,
        t: &Tensor,
    ) -> Result<Failure> {
        let kind = if scan.nan > 0 {
            FindingKind::Nan
        } else {
            self.kind_of_value(f64::INFINITY)
        };
        Ok(Failure {
            stats: Some(TensorStats::of_tensor(t)?),
            ..Failure::new(
                kind,
                phase,
                stage,
                format!("{detail} ({} NaN, {} Inf)", scan.nan, scan.inf),
            )
        })
    }
}
