//! The session's side of the divergence rule
//! ([`crate::probe::DivergenceTracker`]): the step whose loss crosses the
//! line is kept with the state before it ([`crate::checks::pending`], the
//! guard's rule too); the steps after it (at most
//! [`crate::probe::LOOKAHEAD`]) or the run's end judge it, and a crossing
//! judged diverged is a finding at the step that crossed.

use super::{Session, Snapshot};
use crate::checks;
use crate::checks::pending::Kept;
use crate::error::Result;
use crate::finding::{Failure, Finding};

impl Session<'_> {
    /// After a healthy step: keeps the step that crossed the line, or
    /// forgets a crossing that recovered.
    pub(super) fn watch_crossing(&mut self, step: usize, before: Option<&Snapshot>) -> Result<()> {
        let through = self.trace.mark();
        self.pending.watch_crossing(&self.tracker, || {
            Ok(Kept {
                step,
                index: step,
                state: before.cloned(),
                through,
            })
        })
    }

    /// A divergence judged at a later step than its crossing: the finding
    /// of the step that crossed.
    pub(super) fn judged_crossing(&mut self, failure: Failure) -> Option<Finding> {
        let kept = self.pending.take_crossing()?;
        Some(self.kept_finding(kept, failure))
    }

    /// At the end of a run without a finding: the earlier of its jump and
    /// its crossing of the divergence line that the loss never recovered
    /// from (the jump when they share a step: it names a tensor).
    pub fn unrecovered(&mut self) -> Option<Finding> {
        let chance = self.case.loss.chance_loss(self.case.model.classes());
        let (kept, failure) =
            self.pending
                .unrecovered(&self.tracker, &self.trace.losses, chance)?;
        Some(self.kept_finding(kept, failure))
    }

    /// The run's crossing as a `divergence` finding, unjudged: a replay of
    /// its step sees the crossing, not the steps after it.
    pub fn crossing_finding(&mut self) -> Option<Finding> {
        let failure = checks::crossing(&self.tracker)?;
        self.judged_crossing(failure)
    }

    /// The step the run's pending crossing happened at, if any.
    pub fn crossing_step(&self) -> Option<usize> {
        self.pending.crossing_step()
    }

    /// The finding of a failure judged after its step: the state before
    /// the step is kept for dumps and the precision check, and the history
    /// ends with the step.
    pub(super) fn kept_finding(
        &mut self,
        kept: Kept<Option<Snapshot>>,
        failure: Failure,
    ) -> Finding {
        self.failed_before = kept.state;
        let mut f = self.finding(kept.step, failure);
        let scale = f.trace.loss_scale;
        f.trace = f.trace.upto(kept.through);
        f.trace.loss_scale = scale;
        f
    }
}
