//! The explosion rule in a user's loop, the runner's rule
//! ([`crate::checks::explosion`]): the loop's first jump of the gradient
//! or the parameter norm is warned about when it happens (the loop goes
//! on), kept with the state before its step, and judged by
//! [`Guard::finish`] over the whole loop — an explosion finding, with its
//! scene, when the loss never recovered.

use super::optim::SavedOptimizer;
use super::state::Before;
use super::{Batch, Guard, GuardError, GuardOptimizer};
use crate::checks::explosion::{self, Grew, Jump};
use crate::error::Result;
use crate::finding::{Finding, Trace, TraceMark};
use crate::probe::DivergenceTracker;
use candle_core::Tensor;

/// The loop's first jump and what its finding needs.
pub(super) struct GuardJump {
    pub(super) jump: Jump,
    /// The jump's step's index in the guard's history (the user's step
    /// numbers need not start at 0).
    index: usize,
    /// The parameters, optimizer state, tracker and history before its step.
    params: Vec<Tensor>,
    optimizer: Option<SavedOptimizer>,
    tracker: DivergenceTracker,
    history: Trace,
    /// The history through the end of its step (the finding's trace).
    through: TraceMark,
    batch: Option<Batch>,
}

impl Guard {
    /// A norm jumped at `step` (from `was` to `now`, led by `leader`): a
    /// warning, and the loop's first jump is kept for [`Guard::finish`].
    pub(super) fn saw_jump(
        &mut self,
        step: usize,
        grew: Grew,
        (was, now): (f64, f64),
        leader: String,
        before: &Before,
    ) -> Result<()> {
        if self.jump.is_some() {
            return Ok(());
        }
        let jump = Jump {
            step,
            grew,
            before: was,
            after: now,
            tensor: leader,
        };
        self.warnings.push(format!(
            "step {step}: {}: a finite explosion unless the loss recovers; clip the gradient norm or lower the learning rate",
            jump.describe()
        ));
        // Prepared updates leave the variables as they were before the step.
        let params = match &before.params {
            Some(params) => params.clone(),
            None => self
                .vars
                .iter()
                .map(|v| v.as_tensor().copy())
                .collect::<candle_core::Result<_>>()?,
        };
        self.jump = Some(GuardJump {
            jump,
            index: self.trace.losses.len().saturating_sub(1),
            params,
            optimizer: before.optimizer.clone(),
            tracker: before.tracker.clone(),
            history: before.history.clone(),
            through: self.trace.mark(),
            batch: None,
        });
        Ok(())
    }

    /// Keeps the batch of the step that jumped (for the scene).
    pub(super) fn keep_jump_batch(&mut self, batch: &Batch) {
        if let Some(j) = self.jump.as_mut().filter(|j| j.batch.is_none()) {
            j.batch = Some(batch.clone());
        }
    }

    /// Ends a guarded loop: its first jump, if the loss never recovered
    /// from it, is an `explosion` finding (its scene written as for any
    /// finding, from the state before the jump's step). `Ok` when the loop
    /// had no jump, recovered from it, or ran too few steps after it.
    pub fn finish<O: GuardOptimizer + ?Sized>(
        &mut self,
        opt: &O,
    ) -> std::result::Result<(), GuardError> {
        let Some(j) = &self.jump else {
            return Ok(());
        };
        let chance = self.opts.chance_loss;
        let Some(judged) = explosion::unrecovered(j.index, &self.trace.losses, chance) else {
            return Ok(());
        };
        let j = self.jump.take().expect("checked above");
        let failure = explosion::failure(&j.jump, &judged);
        let trace = self.trace.upto(j.through);
        let mut finding = Finding::new(j.jump.step, failure, &self.subject(opt), trace);
        let before = Before {
            params: Some(j.params),
            buffers: Vec::new(),
            optimizer: j.optimizer,
            tracker: j.tracker,
            history: j.history,
        };
        let batch = j
            .batch
            .unwrap_or_else(|| Batch::new(Vec::<(String, Tensor)>::new()));
        let now: Vec<Tensor> = self
            .vars
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<candle_core::Result<_>>()?;
        // The scene holds the state before the jump's step, as the finding says.
        for (v, t) in self.vars.iter().zip(before.params.iter().flatten()) {
            v.set(t)?;
        }
        let check = self.precision_check(&finding, &before, &batch);
        let dump = self.write_scene(&finding, &before, opt, &batch);
        for (v, t) in self.vars.iter().zip(&now) {
            v.set(t)?;
        }
        finding.precision = Some(Box::new(check?));
        Err(GuardError::Unstable {
            finding: Box::new(finding),
            dump: dump?,
        })
    }
}
