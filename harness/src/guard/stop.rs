//! Ending a failed guarded step: the state from before it back in place,
//! the traced re-run that names the first producer (the same analysis as
//! the runner's, [`crate::localize`]), the finding built with the one
//! constructor, its precision check, and the scene.

use super::optim::opt_var_names;
use super::state::Before;
use super::{Batch, Guard, GuardError, GuardOptimizer};
use crate::checks;
use crate::error::Result;
use crate::finding::{Failure, Finding, FindingKind, Phase};
use crate::localize;
use crate::scene::OptimizerRecord;
use candle_core::{Result as CandleResult, Tensor};
use std::path::PathBuf;

impl Guard {
    /// Ends a failed step: restores the state from before it, localizes,
    /// builds the finding, checks it at higher precision, writes the
    /// scene, and makes the error.
    pub(super) fn stop<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        first: Failure,
        before: &Before,
        opt: &mut O,
        batch: &Batch,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> GuardError {
        match self.stopped(step, first, before, opt, batch, loss_of) {
            Ok(e) => e,
            Err(e) => e.into(),
        }
    }

    fn stopped<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        first: Failure,
        before: &Before,
        opt: &mut O,
        batch: &Batch,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> Result<GuardError> {
        // The finding's history ends with the failing step, as the runner's.
        let trace = self.trace.clone();
        self.restore(before, opt)?;
        let failure = self.localize(first, batch, loss_of)?;
        let mut finding = Finding::new(step, failure, &self.subject(opt), trace);
        let check = self.precision_check(&finding, before, batch)?;
        finding.precision = Some(Box::new(check));
        let deterministic = match &self.opts.dump {
            Some(_) => self.deterministic(batch, loss_of),
            None => None,
        };
        let dump = self.write_scene(&finding, before, opt, batch, deterministic)?;
        Ok(GuardError::Unstable {
            finding: Box::new(finding),
            dump,
        })
    }

    /// Whether two runs of the step's loss (from the state before it)
    /// give the same bits; `None` when the loss fails to run.
    fn deterministic(
        &self,
        batch: &Batch,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> Option<bool> {
        let (a, b) = (loss_of(batch).ok()?, loss_of(batch).ok()?);
        crate::scene::same_bits(&a, &b).ok()
    }

    /// Writes the scene of `finding` (the variables hold the state from
    /// before its step), when the options name a directory, with whether
    /// the loss came out the same twice.
    pub(super) fn write_scene<O: GuardOptimizer + ?Sized>(
        &self,
        finding: &Finding,
        before: &Before,
        opt: &O,
        batch: &Batch,
        deterministic: Option<bool>,
    ) -> Result<Option<PathBuf>> {
        let Some(dir) = &self.opts.dump else {
            return Ok(None);
        };
        let params: Vec<Tensor> = self.vars.iter().map(|v| v.as_tensor().clone()).collect();
        let optimizer_vars = opt_var_names(opt, &self.vars, &self.names);
        let (optimizer, optimizer_state) = match &before.optimizer {
            Some(o) => (
                OptimizerRecord::Saved {
                    spec: o.spec.clone(),
                    steps: o.steps,
                },
                o.named_state(&optimizer_vars),
            ),
            None => (
                OptimizerRecord::NotAvailable { name: opt.name() },
                Vec::new(),
            ),
        };
        let saved = crate::scene::SceneParts {
            origin: None,
            case: None,
            step: finding.step,
            finding: Some(finding),
            trace: &finding.trace,
            history: self.trace.upto(before.history),
            vars: &self.names,
            params,
            optimizer,
            optimizer_state,
            optimizer_vars,
            tracker: &before.tracker,
            scaler: None,
            batch: batch.parts().to_vec(),
            extra: Vec::new(),
            mix_lambda: None,
            include: &self.opts.include,
            device: finding.signature.device.to_string(),
            deterministic,
        };
        crate::scene::write(dir, &saved)?;
        Ok(Some(dir.clone()))
    }

    /// The first producer of a loss or backward failure, by a traced
    /// re-run of the loss (nothing is updated); where the gradient flow
    /// stops for a `no_gradient` one. Other failures are their own producer.
    fn localize(
        &self,
        first: Failure,
        batch: &Batch,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> Result<Failure> {
        if !matches!(first.phase, Phase::Loss | Phase::Backward) {
            return Ok(first);
        }
        let tracer = self.tracer(true);
        let shared = crate::models::tracer::share(&tracer);
        let loss = loss_of(batch);
        drop(shared);
        let loss = loss?;
        let records = tracer.records();
        if first.kind == FindingKind::NoGradient {
            let grads = loss.backward()?;
            let coverage = crate::coverage::of(&self.names, &self.vars, &grads, &records);
            return Ok(checks::coverage(coverage).unwrap_or(first));
        }
        let half = self.half();
        if let Some(f) = localize::forward_producer(&records, &batch.tensors(), half)? {
            return Ok(f);
        }
        if !super::phases::scalar(&loss)?.is_finite() {
            return Ok(match records.is_empty() {
                true => untraced(first),
                false => first,
            });
        }
        let grads = loss.backward()?;
        Ok(localize::backward_producer(&records, &grads, half, "loss")?.unwrap_or(first))
    }
}

/// A non-finite loss with no stage recorded: the closure's forward pass
/// and its loss cannot be told apart, and the finding says so rather than
/// blame the loss.
fn untraced(mut first: Failure) -> Failure {
    if first.phase == Phase::Loss {
        first.detail.push_str(
            "; no stage was traced, so this may come from the model's forward pass as well as from the loss: `Guard::step_with_output` (or `nanhunt::trace` on the model's output) tells them apart",
        );
    }
    first
}
