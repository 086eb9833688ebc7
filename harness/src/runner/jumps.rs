//! The session's side of the explosion rule ([`crate::checks::explosion`]):
//! after each healthy step the shared [`JumpWatch`] says whether a norm
//! jumped; the session keeps the run's first jump with the state before
//! its step, and the run's end judges it.

use super::{Readback, Session, Snapshot};
use crate::checks::explosion::{self, Grew, Jump, JumpWatch};
use crate::error::Result;
use crate::finding::{Finding, TraceMark};
use candle_core::Tensor;

/// The run's first jump, kept until the run's end judges it.
pub(super) struct Jumped {
    pub jump: Jump,
    /// The state before the jump's step.
    pub before: Option<Snapshot>,
    /// The history up to the end of the jump's step (the finding's trace,
    /// as for every finding; the recovery is judged on the whole run).
    pub through: TraceMark,
}

/// What a healthy step leaves for the jump check: the norms' counts and
/// the history before it, the state before it, and (deferred readback)
/// the state before the previous step, whose update is checked now.
pub(super) struct StepSeen<'s> {
    pub grad_norms: usize,
    pub param_norms: usize,
    pub mark: TraceMark,
    pub before: Option<&'s Snapshot>,
    pub previous: Option<Snapshot>,
}

impl Session<'_> {
    /// After a healthy step: the run's first jump of the gradient norm
    /// (this step's against the largest before it) or of the parameter
    /// norm (the newest against the one before, or the initialization's).
    pub(super) fn watch_jumps(&mut self, step: usize, seen: StepSeen) -> Result<()> {
        if !self.probe || !self.watch_divergence || self.jump.is_some() {
            return Ok(());
        }
        let now = self.trace.mark();
        if let Some(&norm) = self.trace.grad_norms.get(seen.grad_norms) {
            if let Some(before) = self.watch.gradient(norm) {
                let jump = Jump {
                    step,
                    grew: Grew::GradientNorm,
                    before,
                    after: norm,
                    tensor: self.names[explosion::largest(&self.grad_sq)].clone(),
                };
                self.jump = Some(Jumped {
                    jump,
                    before: seen.before.cloned(),
                    through: now,
                });
                return Ok(());
            }
        }
        let Some(&norm) = self.trace.param_norms.get(seen.param_norms) else {
            return Ok(());
        };
        let Some(last) = self.watch.parameters(norm) else {
            return Ok(());
        };
        // Read in place, this step's update; deferred, the previous step's.
        let (at, snapshot, through) = match self.readback {
            Readback::InPlace => (step, seen.before.cloned(), now),
            Readback::Deferred => (step.saturating_sub(1), seen.previous, seen.mark),
        };
        let tensor = match &snapshot {
            Some(s) => self.fastest_growing(&s.params)?,
            None => String::new(),
        };
        let jump = Jump {
            step: at,
            grew: Grew::ParameterNorm,
            before: last,
            after: norm,
            tensor,
        };
        self.jump = Some(Jumped {
            jump,
            before: snapshot,
            through,
        });
        Ok(())
    }

    /// The parameter whose norm grew by the most against `earlier`.
    fn fastest_growing(&self, earlier: &[Tensor]) -> Result<String> {
        let now: Vec<&Tensor> = self.vars.iter().map(|v| v.as_tensor()).collect();
        let then: Vec<&Tensor> = earlier.iter().collect();
        Ok(self.names[explosion::fastest_growing(&now, &then)?].clone())
    }

    /// The run's first jump, if it had one.
    pub fn jump(&self) -> Option<&Jump> {
        self.jump.as_ref().map(|j| &j.jump)
    }

    /// The jump watch as it stands after the session's history.
    pub(super) fn watch_after_history(&self) -> JumpWatch {
        JumpWatch::after(self.init_norm, &self.trace)
    }

    /// At the end of a run without a finding: its jump, if the loss never
    /// recovered from it, as an `explosion` finding (the state before its
    /// step kept for dumps and the precision check).
    pub fn unrecovered_explosion(&mut self) -> Option<Finding> {
        let jump = &self.jump.as_ref()?.jump;
        let chance = self.case.loss.chance_loss(self.case.model.classes());
        let judged = explosion::unrecovered(jump.step, &self.trace.losses, chance)?;
        self.explosion_finding(&judged)
    }

    /// The run's jump as an `explosion` finding, unjudged: a replay of its
    /// step sees the jump, not the steps after it.
    pub fn jump_finding(&mut self) -> Option<Finding> {
        self.explosion_finding(explosion::UNJUDGED)
    }

    fn explosion_finding(&mut self, judged: &str) -> Option<Finding> {
        let Jumped {
            jump,
            before,
            through,
        } = self.jump.take()?;
        let failure = explosion::failure(&jump, judged);
        Some(self.kept_finding(jump.step, before, through, failure))
    }
}
