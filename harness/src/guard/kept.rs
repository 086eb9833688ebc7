//! A guarded step kept to be judged later, by the steps after it or by
//! [`Guard::finish`]: the loop's first jump of a norm, the step whose loss
//! crossed the divergence line. Judged a failure, it is a finding at its
//! own step, with its scene written from the state before it.

use super::optim::SavedOptimizer;
use super::state::Before;
use super::{Batch, Guard, GuardError, GuardOptimizer};
use crate::checks;
use crate::error::Result;
use crate::finding::{Failure, Finding, TraceMark};
use crate::probe::DivergenceTracker;
use candle_core::Tensor;

/// A step and the state before it.
pub(super) struct Kept {
    pub step: usize,
    /// Its step's index in the guard's history (the user's step numbers
    /// need not start at 0).
    pub index: usize,
    /// The parameters, optimizer state, tracker and history before it.
    params: Vec<Tensor>,
    optimizer: Option<SavedOptimizer>,
    tracker: DivergenceTracker,
    history: TraceMark,
    /// The history through the end of its step (the finding's trace).
    through: TraceMark,
    pub batch: Option<Batch>,
}

impl Guard {
    /// Keeps `step`, whose state before it is `before`; called before the
    /// step's update is set.
    pub(super) fn keep<O: GuardOptimizer + ?Sized>(
        &self,
        step: usize,
        before: &Before,
        opt: &O,
    ) -> Result<Kept> {
        // Prepared updates leave the variables as they were before the step.
        let params = match &before.params {
            Some(params) => params.clone(),
            None => self
                .vars
                .iter()
                .map(|v| v.as_tensor().copy())
                .collect::<candle_core::Result<_>>()?,
        };
        Ok(Kept {
            step,
            index: self.trace.losses.len().saturating_sub(1),
            params,
            optimizer: before.optimizer_state(opt),
            tracker: before.tracker.clone(),
            history: before.history,
            through: self.trace.mark(),
            batch: None,
        })
    }

    /// After a step's loss trend: keeps the step that crossed the
    /// divergence line, or forgets a crossing that recovered.
    pub(super) fn watch_crossing<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        batch: &Batch,
        before: &Before,
        opt: &O,
    ) -> Result<()> {
        if self.tracker.crossed_now() {
            let mut kept = self.keep(step, before, opt)?;
            kept.batch = Some(batch.clone());
            self.crossing = Some(kept);
        } else if !self.tracker.pending() {
            self.crossing = None;
        }
        Ok(())
    }

    /// The crossing of the divergence line that the loss never recovered
    /// from, at the loop's end, as an error with its finding.
    pub(super) fn unrecovered_divergence<O: GuardOptimizer + ?Sized>(
        &mut self,
        opt: &O,
    ) -> Option<GuardError> {
        let failure = checks::trend_at_end(&self.tracker)?;
        let kept = self.crossing.take()?;
        Some(self.judged(kept, failure, opt))
    }

    /// The loop's crossing at this step as an unjudged `divergence`
    /// finding (what a replay of its step sees).
    pub(super) fn crossing_finding<O: GuardOptimizer + ?Sized>(
        &self,
        step: usize,
        opt: &O,
    ) -> Option<Finding> {
        let failure = checks::crossing(&self.tracker)?;
        Some(Finding::new(
            step,
            failure,
            &self.subject(opt),
            self.trace.clone(),
        ))
    }

    /// `kept` judged a failure: its finding, precision check and scene
    /// (written from the state before its step; the variables then hold
    /// what they held before).
    pub(super) fn judged<O: GuardOptimizer + ?Sized>(
        &mut self,
        kept: Kept,
        failure: Failure,
        opt: &O,
    ) -> GuardError {
        match self.judged_finding(kept, failure, opt) {
            Ok(e) => e,
            Err(e) => e.into(),
        }
    }

    fn judged_finding<O: GuardOptimizer + ?Sized>(
        &mut self,
        kept: Kept,
        failure: Failure,
        opt: &O,
    ) -> Result<GuardError> {
        let trace = self.trace.upto(kept.through);
        let mut finding = Finding::new(kept.step, failure, &self.subject(opt), trace);
        let before = Before {
            params: Some(kept.params),
            buffers: Vec::new(),
            optimizer: kept.optimizer,
            deferred: false,
            tracker: kept.tracker,
            history: kept.history,
        };
        let batch = kept
            .batch
            .unwrap_or_else(|| Batch::new(Vec::<(String, Tensor)>::new()));
        let now: Vec<Tensor> = self
            .vars
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<candle_core::Result<_>>()?;
        // The scene holds the state before the kept step, as the finding says.
        for (v, t) in self.vars.iter().zip(before.params.iter().flatten()) {
            v.set(t)?;
        }
        let check = self.precision_check(&finding, &before, &batch);
        let dump = self.write_scene(&finding, &before, opt, &batch, None);
        for (v, t) in self.vars.iter().zip(&now) {
            v.set(t)?;
        }
        finding.precision = Some(Box::new(check?));
        Ok(GuardError::Unstable {
            finding: Box::new(finding),
            dump: dump?,
        })
    }
}
