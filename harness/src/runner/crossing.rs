//! The session's side of the divergence rule
//! ([`crate::probe::DivergenceTracker`]): the step whose loss crosses the
//! line is kept with the state before it; the steps after it (at most
//! [`crate::probe::LOOKAHEAD`]) or the run's end judge it, and a crossing
//! judged diverged is a finding at the step that crossed.

use super::{Session, Snapshot};
use crate::checks;
use crate::finding::{Failure, Finding, TraceMark};

/// The step whose loss crossed the divergence line, kept until judged.
pub(super) struct Crossed {
    pub step: usize,
    /// The state before it.
    pub before: Option<Snapshot>,
    /// The history up to the end of its step (the finding's trace).
    pub through: TraceMark,
}

impl Session<'_> {
    /// After a healthy step: keeps the step that crossed the line, or
    /// forgets a crossing that recovered.
    pub(super) fn watch_crossing(&mut self, step: usize, before: Option<&Snapshot>) {
        if self.tracker.crossed_now() {
            self.crossing = Some(Crossed {
                step,
                before: before.cloned(),
                through: self.trace.mark(),
            });
        } else if !self.tracker.pending() {
            self.crossing = None;
        }
    }

    /// A divergence judged at a later step than its crossing: the finding
    /// of the step that crossed.
    pub(super) fn judged_crossing(&mut self, failure: Failure) -> Option<Finding> {
        let Crossed {
            step,
            before,
            through,
        } = self.crossing.take()?;
        Some(self.kept_finding(step, before, through, failure))
    }

    /// At the end of a run without a finding: its crossing of the
    /// divergence line, if the loss never recovered from it.
    pub fn unrecovered_divergence(&mut self) -> Option<Finding> {
        let failure = checks::trend_at_end(&self.tracker)?;
        self.judged_crossing(failure)
    }

    /// At the end of a run without a finding: the earlier of its jump and
    /// its crossing of the divergence line that the loss never recovered
    /// from (the jump when they share a step: it names a tensor).
    pub fn unrecovered(&mut self) -> Option<Finding> {
        if checks::crossing_first(self.jump().map(|j| j.step), self.crossing_step()) {
            self.unrecovered_divergence()
                .or_else(|| self.unrecovered_explosion())
        } else {
            self.unrecovered_explosion()
                .or_else(|| self.unrecovered_divergence())
        }
    }

    /// The run's crossing as a `divergence` finding, unjudged: a replay of
    /// its step sees the crossing, not the steps after it.
    pub fn crossing_finding(&mut self) -> Option<Finding> {
        let failure = checks::crossing(&self.tracker)?;
        self.judged_crossing(failure)
    }

    /// The step the run's pending crossing happened at, if any.
    pub fn crossing_step(&self) -> Option<usize> {
        self.crossing.as_ref().map(|c| c.step)
    }

    /// The finding of a failure judged after its step: the state before
    /// the step is kept for dumps and the precision check, and the history
    /// ends with the step.
    pub(super) fn kept_finding(
        &mut self,
        step: usize,
        before: Option<Snapshot>,
        through: TraceMark,
        failure: Failure,
    ) -> Finding {
        self.failed_before = before;
        let mut f = self.finding(step, failure);
        let scale = f.trace.loss_scale;
        f.trace = f.trace.upto(through);
        f.trace.loss_scale = scale;
        f
    }
}
