//! The session's side of the explosion rule ([`crate::checks::explosion`]):
//! after each healthy step the shared [`JumpWatch`] says whether a norm
//! jumped; the session keeps the run's first jump with the state before
//! its step ([`crate::checks::pending`], the guard's rule too), and the
//! run's end judges it.

use super::{Readback, Session, Snapshot};
use crate::checks::explosion::{self, Grew, Jump, JumpWatch};
use crate::checks::pending::Kept;
use crate::error::Result;
use crate::finding::{Finding, TraceMark, Warning};
use candle_core::Tensor;

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
        if !self.probe || !self.watch_divergence || self.pending.jump().is_some() {
            return Ok(());
        }
        if let Some(&norm) = self.trace.grad_norms.get(seen.grad_norms) {
            if let Some(before) = self.watch.gradient(norm) {
                let jump = Jump {
                    step,
                    grew: Grew::GradientNorm,
                    before,
                    after: norm,
                    tensor: self.names[explosion::largest(&self.grad_sq)].clone(),
                };
                // Warned of when seen; the kept trace ends with the warning.
                self.trace.warnings.push(Warning::Jump(jump.clone()));
                let kept = Kept {
                    step,
                    index: step,
                    state: seen.before.cloned(),
                    through: self.trace.mark(),
                };
                self.pending.keep_jump(jump, kept);
                return Ok(());
            }
        }
        let Some(&norm) = self.trace.param_norms.get(seen.param_norms) else {
            return Ok(());
        };
        let Some(last) = self.watch.parameters(norm) else {
            return Ok(());
        };
        // Read in place, this step's update; deferred, the previous step's
        // (whose kept trace ends before this step, its warning included).
        let (at, snapshot, through) = match self.readback {
            Readback::InPlace => (step, seen.before.cloned(), None),
            Readback::Deferred => (step.saturating_sub(1), seen.previous, Some(seen.mark)),
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
        self.trace.warnings.push(Warning::Jump(jump.clone()));
        let kept = Kept {
            step: at,
            index: at,
            state: snapshot,
            through: through.unwrap_or_else(|| self.trace.mark()),
        };
        self.pending.keep_jump(jump, kept);
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
        self.pending.jump()
    }

    /// The jump watch as it stands after the session's history.
    pub(super) fn watch_after_history(&self) -> JumpWatch {
        JumpWatch::after(self.init_norm, &self.trace)
    }

    /// The run's jump as an `explosion` finding, unjudged: a replay of its
    /// step sees the jump, not the steps after it.
    pub fn jump_finding(&mut self) -> Option<Finding> {
        let (jump, kept) = self.pending.take_jump()?;
        let failure = explosion::failure(&jump, explosion::UNJUDGED);
        Some(self.kept_finding(kept, failure))
    }
}
