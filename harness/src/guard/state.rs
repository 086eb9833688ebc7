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
    pub optimizer: Option<SavedOptimizer>,
    pub tracker: DivergenceTracker,
    /// How long the history was: a step only appends to it, so truncating
    /// to the mark undoes it (a copy of the history every step would cost
    /// O(steps) a step).
    pub history: TraceMark,
}

impl Guard {
    /// The state before a step.
    pub(super) fn save<O: GuardOptimizer + ?Sized>(&self, opt: &O) -> Result<Before> {
        let copy = |vars: &[Var]| -> CandleResult<Vec<Tensor>> {
            vars.iter().map(|v| v.as_tensor().copy()).collect()
        };
        Ok(Before {
            params: if opt.can_prepare() {
                None
            } else {
                Some(copy(&self.vars)?)
            },
            buffers: copy(&self.buffers)?,
            optimizer: opt.saved(),
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
