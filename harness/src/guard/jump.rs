//! The explosion rule in a user's loop, the runner's rule
//! ([`crate::checks::explosion`]): the loop's first jump of the gradient
//! or the parameter norm is warned about when it happens (the loop goes
//! on), kept with the state before its step, and judged by
//! [`Guard::finish`] over the whole loop — an explosion finding, with its
//! scene, when the loss never recovered.

use super::kept::keep;
use super::state::Before;
use super::{Batch, Guard, GuardError, GuardOptimizer};
use crate::checks::explosion::{Grew, Jump};
use crate::error::Result;
use crate::finding::Warning;

impl Guard {
    /// A norm jumped at `step` (from `was` to `now`, led by `leader`): a
    /// warning, and the loop's first jump is kept for [`Guard::finish`].
    pub(super) fn saw_jump<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        grew: Grew,
        (was, now): (f64, f64),
        leader: String,
        (before, opt): (&Before, &O),
    ) -> Result<()> {
        if self.pending.jump().is_some() {
            return Ok(());
        }
        let jump = Jump {
            step,
            grew,
            before: was,
            after: now,
            tensor: leader,
        };
        self.trace.warnings.push(Warning::Jump(jump.clone()));
        let kept = keep((&self.vars, &self.trace), step, before, opt)?;
        self.pending.keep_jump(jump, kept);
        Ok(())
    }

    /// Keeps the batch of the step that jumped (for the scene).
    pub(super) fn keep_jump_batch(&mut self, batch: &Batch) {
        if let Some(k) = self
            .pending
            .jump_kept_mut()
            .filter(|k| k.state.batch.is_none())
        {
            k.state.batch = Some(batch.clone());
        }
    }

    /// Ends a guarded loop: its first jump, if the loss never recovered
    /// from it, is an `explosion` finding, and its crossing of the
    /// divergence line, if the loss never came back below the best of the
    /// crossing, a `divergence` finding (the earlier of the two; each with
    /// its scene, written as for any finding from the state before its
    /// step). `Ok` when neither: no jump or crossing, recovered, or too
    /// few steps after a jump to judge.
    pub fn finish<O: GuardOptimizer + ?Sized>(
        &mut self,
        opt: &O,
    ) -> std::result::Result<(), GuardError> {
        let chance = self.opts.chance_loss;
        match self
            .pending
            .unrecovered(&self.tracker, &self.trace.losses, chance)
        {
            Some((kept, failure)) => Err(self.judged(kept, failure, opt)),
            None => Ok(()),
        }
    }
}
