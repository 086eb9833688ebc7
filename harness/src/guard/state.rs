//! The state a guarded step changes, kept before it to undo it: the
//! parameters (when the optimizer sets them before they can be checked),
//! the buffers, the optimizer's state, the tracker and the history.

use super::optim::SavedOptimizer;
use super::{Guard, GuardOptimizer};
use crate::error::Result;
use crate::finding::TraceMark;
use crate::probe::DivergenceTracker;
use candle_core::{Result as CandleResult, Tensor, Var};

/// The state a step changes, kept to undo it.
pub(super) struct Before {
    /// A copy of the parameters, when the optimizer sets them before they
    /// can be checked; `None`: they change only after the checks pass.
    pub params: Option<Vec<Tensor>>,
    pub buffers: Vec<Tensor>,
    /// The optimizer's state; see `deferred`.
    pub optimizer: Option<SavedOptimizer>,
    /// The optimizer's state was not read: an optimizer that prepares its
    /// update changes its state only when the update is committed, after
    /// every check, so until then its state is the state before the step
    /// (read by [`Before::settle`] when a failure or a kept step needs it,
    /// instead of every step).
    pub deferred: bool,
    pub tracker: DivergenceTracker,
    /// How long the history was: a step only appends to it, so truncating
    /// to the mark undoes it (a copy of the history every step would cost
    /// O(steps) a step).
    pub history: TraceMark,
}

impl Before {
    /// Reads the optimizer's state if it was deferred; call before the
    /// step's update is committed.
    pub fn settle<O: GuardOptimizer + ?Sized>(&mut self, opt: &O) {
        if std::mem::take(&mut self.deferred) {
            self.optimizer = opt.saved();
        }
    }

    /// The optimizer's state before the step (before its commit).
    pub fn optimizer_state<O: GuardOptimizer + ?Sized>(&self, opt: &O) -> Option<SavedOptimizer> {
        if self.deferred {
            opt.saved()
        } else {
            self.optimizer.clone()
        }
    }
}

impl Guard {
    /// The state before a step.
    pub(super) fn save<O: GuardOptimizer + ?Sized>(&self, opt: &O) -> Result<Before> {
        let copy = |vars: &[Var]| -> CandleResult<Vec<Tensor>> {
            vars.iter().map(|v| v.as_tensor().copy()).collect()
        };
        let deferred = opt.can_prepare();
        Ok(Before {
            params: if deferred {
                None
            } else {
                Some(copy(&self.vars)?)
            },
            buffers: copy(&self.buffers)?,
            optimizer: if deferred { None } else { opt.saved() },
            deferred,
            tracker: self.tracker.clone(),
            history: self.trace.mark(),
        })
    }

    /// Puts the parameters, optimizer, tracker and history back as they
    /// were before the step.
    pub(super) fn restore<O: GuardOptimizer + ?Sized>(
        &mut self,
        before: &Before,
        opt: &mut O,
    ) -> Result<()> {
        if let Some(params) = &before.params {
            for (v, t) in self.vars.iter().zip(params) {
                v.set(t)?;
            }
        }
        for (v, t) in self.buffers.iter().zip(&before.buffers) {
            v.set(t)?;
        }
        if let Some(saved) = &before.optimizer {
            opt.restore(saved)?;
        }
        self.tracker = before.tracker.clone();
        self.trace.truncate(before.history);
        self.watch = crate::checks::explosion::JumpWatch::after(self.init_norm, &self.trace);
        Ok(())
    }
}
