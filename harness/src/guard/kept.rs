//! A guarded step kept to be judged later ([`crate::checks::pending`], the
//! runner's rule too), by the steps after it or by [`Guard::finish`]: the
//! loop's first jump of a norm, the step whose loss crossed the divergence
//! line. Judged a failure, it is a finding at its own step, with its scene
//! written from the state before it.

use super::optim::SavedOptimizer;
use super::state::Before;
use super::{Batch, Guard, GuardError, GuardOptimizer};
use crate::checks;
use crate::checks::pending::Kept;
use crate::error::Result;
use crate::finding::{Failure, Finding, Trace, TraceMark};
use crate::probe::DivergenceTracker;
use candle_core::{Tensor, Var};

/// The state before a kept step: what its scene is written from.
pub(super) struct Saved {
    /// The parameters, optimizer state, tracker and history before it.
    params: Vec<Tensor>,
    optimizer: Option<SavedOptimizer>,
    tracker: DivergenceTracker,
    history: TraceMark,
    pub batch: Option<Batch>,
}

/// Keeps `step`, whose state before it is `before`, from the guard's
/// variables and history; called before the step's update is set.
pub(super) fn keep<O: GuardOptimizer + ?Sized>(
    (vars, trace): (&[Var], &Trace),
    step: usize,
    before: &Before,
    opt: &O,
) -> Result<Kept<Saved>> {
    // Prepared updates leave the variables as they were before the step.
    let params = match &before.params {
        Some(params) => params.clone(),
        None => vars
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<candle_core::Result<_>>()?,
    };
    Ok(Kept {
        step,
        index: trace.losses.len().saturating_sub(1),
        state: Saved {
            params,
            optimizer: before.optimizer_state(opt),
            tracker: before.tracker.clone(),
            history: before.history,
            batch: None,
        },
        through: trace.mark(),
    })
}

impl Guard {
    /// After a step's loss trend: keeps the step that crossed the
    /// divergence line, or forgets a crossing that recovered.
    pub(super) fn watch_crossing<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        batch: &Batch,
        before: &Before,
        opt: &O,
    ) -> Result<()> {
        let at = (&self.vars[..], &self.trace);
        self.pending.watch_crossing(&self.tracker, || {
            let mut kept = keep(at, step, before, opt)?;
            kept.state.batch = Some(batch.clone());
            Ok(kept)
        })
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
        kept: Kept<Saved>,
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
        kept: Kept<Saved>,
        failure: Failure,
        opt: &O,
    ) -> Result<GuardError> {
        let trace = self.trace.upto(kept.through);
        let mut finding = Finding::new(kept.step, failure, &self.subject(opt), trace);
        let saved = kept.state;
        let before = Before {
            params: Some(saved.params),
            buffers: Vec::new(),
            optimizer: saved.optimizer,
            deferred: false,
            tracker: saved.tracker,
            history: saved.history,
        };
        let batch = saved
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
