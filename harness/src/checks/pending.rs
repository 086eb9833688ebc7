//! Steps kept to be judged later, written once for both drivers: a run's
//! first jump of a norm (the explosion rule) and the step whose loss
//! crossed the divergence line. Each is kept with the driver's state from
//! before its step (`S`: the runner's snapshot, the guard's saved
//! variables and batch); the steps after it, or the run's end, judge it,
//! and a failure judged there is a finding at the kept step.

use super::explosion::{self, Jump};
use crate::error::Result;
use crate::finding::{Failure, TraceMark};
use crate::probe::DivergenceTracker;

/// A step kept until it is judged, with the driver's state before it.
pub(crate) struct Kept<S> {
    pub step: usize,
    /// Its step's index in the run's loss history (a guard's step numbers
    /// need not start at 0).
    pub index: usize,
    pub state: S,
    /// The history through the end of its step (the finding's trace).
    pub through: TraceMark,
}

/// A run's kept steps: its first jump, and its pending crossing.
pub(crate) struct Pending<S> {
    jump: Option<(Jump, Kept<S>)>,
    crossing: Option<Kept<S>>,
}

impl<S> Default for Pending<S> {
    fn default() -> Self {
        Pending {
            jump: None,
            crossing: None,
        }
    }
}

impl<S> Pending<S> {
    /// The run's first jump, if it had one.
    pub fn jump(&self) -> Option<&Jump> {
        self.jump.as_ref().map(|(j, _)| j)
    }

    /// The kept step of the run's first jump.
    pub fn jump_kept_mut(&mut self) -> Option<&mut Kept<S>> {
        self.jump.as_mut().map(|(_, k)| k)
    }

    /// Keeps `jump` with its step, unless the run already jumped.
    pub fn keep_jump(&mut self, jump: Jump, kept: Kept<S>) {
        if self.jump.is_none() {
            self.jump = Some((jump, kept));
        }
    }

    pub fn take_jump(&mut self) -> Option<(Jump, Kept<S>)> {
        self.jump.take()
    }

    /// The step the pending crossing happened at, if any.
    pub fn crossing_step(&self) -> Option<usize> {
        self.crossing.as_ref().map(|c| c.step)
    }

    pub fn take_crossing(&mut self) -> Option<Kept<S>> {
        self.crossing.take()
    }

    /// After a healthy step: keeps the step that crossed the divergence
    /// line (`keep` makes it), or forgets a crossing that recovered.
    pub fn watch_crossing(
        &mut self,
        tracker: &DivergenceTracker,
        keep: impl FnOnce() -> Result<Kept<S>>,
    ) -> Result<()> {
        if tracker.crossed_now() {
            self.crossing = Some(keep()?);
        } else if !tracker.pending() {
            self.crossing = None;
        }
        Ok(())
    }

    /// At the end of a run without a finding: the earlier of its jump and
    /// its crossing that the loss never recovered from (the jump when they
    /// share a step: it names a tensor), with its failure. `losses` is the
    /// run's loss history, `chance` the loss of a chance guess, if known.
    pub fn unrecovered(
        &mut self,
        tracker: &DivergenceTracker,
        losses: &[f64],
        chance: Option<f64>,
    ) -> Option<(Kept<S>, Failure)> {
        let jumped = self.jump.as_ref().map(|(j, _)| j.step);
        if super::crossing_first(jumped, self.crossing_step()) {
            self.diverged(tracker)
                .or_else(|| self.exploded(losses, chance))
        } else {
            self.exploded(losses, chance)
                .or_else(|| self.diverged(tracker))
        }
    }

    /// The crossing, if the loss never came back below its best.
    fn diverged(&mut self, tracker: &DivergenceTracker) -> Option<(Kept<S>, Failure)> {
        let failure = super::trend_at_end(tracker)?;
        Some((self.crossing.take()?, failure))
    }

    /// The jump, if the loss never recovered from it.
    fn exploded(&mut self, losses: &[f64], chance: Option<f64>) -> Option<(Kept<S>, Failure)> {
        let index = self.jump.as_ref()?.1.index;
        let judged = explosion::unrecovered(index, losses, chance)?;
        let (jump, kept) = self.jump.take()?;
        Some((kept, explosion::failure(&jump, &judged)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::explosion::Grew;
    use crate::finding::FindingKind;

    fn kept(step: usize) -> Kept<usize> {
        Kept {
            step,
            index: step,
            state: step,
            through: TraceMark::default(),
        }
    }

    fn jump(step: usize) -> Jump {
        Jump {
            step,
            grew: Grew::GradientNorm,
            before: 1.0,
            after: 1e4,
            tensor: "w".into(),
        }
    }

    #[test]
    fn the_first_jump_is_kept_and_judged_at_the_end_when_the_loss_never_recovers() {
        let mut p = Pending::<usize>::default();
        p.keep_jump(jump(2), kept(2));
        p.keep_jump(jump(5), kept(5));
        assert_eq!(p.jump().map(|j| j.step), Some(2));
        // A tracker that never crossed keeps no crossing.
        let tracker = DivergenceTracker::new(4.0);
        p.watch_crossing(&tracker, || Ok(kept(3))).unwrap();
        assert_eq!(p.crossing_step(), None);
        // The loss jumps at step 2 and stays up: an explosion at step 2.
        let mut losses = vec![1.0, 1.0];
        losses.extend(std::iter::repeat_n(50.0, 40));
        let (k, failure) = p
            .unrecovered(&tracker, &losses, None)
            .expect("never recovered");
        assert_eq!((k.state, failure.kind), (2, FindingKind::Explosion));
        assert!(p.jump().is_none() && p.unrecovered(&tracker, &losses, None).is_none());
        // A loss that comes back is no finding, and the jump stays kept.
        let mut p = Pending::<usize>::default();
        p.keep_jump(jump(2), kept(2));
        let mut back = vec![1.0, 1.0, 50.0];
        back.extend(std::iter::repeat_n(0.5, 40));
        assert!(p.unrecovered(&tracker, &back, None).is_none());
        assert!(p.jump().is_some());
    }
}
