//! The explosion rule in a user's loop, the runner's rule
//! ([`crate::checks::explosion`]): the loop's first jump of the gradient
//! or the parameter norm is warned about when it happens (the loop goes
//! on), kept with the state before its step, and judged by
//! [`Guard::finish`] over the whole loop — an explosion finding, with its
//! scene, when the loss never recovered.

use super::kept::Kept;
use super::state::Before;
use super::{Batch, Guard, GuardError, GuardOptimizer};
use crate::checks::explosion::{self, Grew, Jump};
use crate::error::Result;

/// The loop's first jump, with its step kept.
pub(super) struct GuardJump {
    pub(super) jump: Jump,
    kept: Kept,
}

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
        let kept = self.keep(step, before, opt)?;
        self.jump = Some(GuardJump { jump, kept });
        Ok(())
    }

    /// Keeps the batch of the step that jumped (for the scene).
    pub(super) fn keep_jump_batch(&mut self, batch: &Batch) {
        if let Some(j) = self.jump.as_mut().filter(|j| j.kept.batch.is_none()) {
            j.kept.batch = Some(batch.clone());
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
        let jumped = self.jump.as_ref().map(|j| j.kept.step);
        let crossed = self.crossing.as_ref().map(|c| c.step);
        let error = if crate::checks::crossing_first(jumped, crossed) {
            self.unrecovered_divergence(opt)
                .or_else(|| self.unrecovered_explosion(opt))
        } else {
            self.unrecovered_explosion(opt)
                .or_else(|| self.unrecovered_divergence(opt))
        };
        error.map_or(Ok(()), Err)
    }

    /// The loop's first jump, if the loss never recovered from it.
    fn unrecovered_explosion<O: GuardOptimizer + ?Sized>(&mut self, opt: &O) -> Option<GuardError> {
        let j = self.jump.as_ref()?;
        let chance = self.opts.chance_loss;
        let judged = explosion::unrecovered(j.kept.index, &self.trace.losses, chance)?;
        let GuardJump { jump, kept } = self.jump.take()?;
        Some(self.judged(kept, explosion::failure(&jump, &judged), opt))
    }
}
