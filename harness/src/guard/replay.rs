//! Replaying a guard's scene: the state from before the failing step goes
//! back into the user's variables, the optimizer is rebuilt from its saved
//! state, and the step runs again on the saved batch through the user's own
//! loss closure. On the CPU the finding and its loss come back bit for bit;
//! a user's `cargo test` can assert it.

use super::optim::{OptimizerRecord, SavedOptimizer};
use super::{Batch, Guard, GuardError, GuardOptions, GuardScene};
use crate::error::{Error, Result};
use crate::finding::{Finding, FindingKind, Phase, Signature};
use crate::spec::OptimizerSpec;
use candle_core::Tensor;
use std::path::Path;

/// What a replay of a guard's scene found.
#[derive(Clone, Debug)]
pub struct GuardReplay {
    pub expected: Signature,
    pub expected_step: usize,
    /// The failure seen now, if any.
    pub actual: Option<Finding>,
    /// Whether the failing step's loss has the recorded bits (when both
    /// runs computed one).
    pub bit_identical: Option<bool>,
    pub message: String,
}

impl GuardReplay {
    /// The recorded signature came back at its step (bit-identical where known).
    pub fn reproduced(&self) -> bool {
        self.actual
            .as_ref()
            .is_some_and(|f| f.signature == self.expected && f.step == self.expected_step)
            && self.bit_identical != Some(false)
    }
}

/// Re-runs the failing step of the scene in `dir` with the variables of
/// `varmap` (the user's model, built as when the scene was written) and
/// the user's loss closure.
pub fn replay(
    dir: &Path,
    varmap: &candle_nn::VarMap,
    loss_of: impl FnMut(&Batch) -> candle_core::Result<Tensor>,
) -> Result<GuardReplay> {
    let (scene, tensors) = GuardScene::load(dir)?;
    let expected = scene.finding.signature.clone();
    let opts = GuardOptions::default().named(expected.family.clone());
    let mut guard = Guard::new(varmap, opts)?;
    if guard.names() != scene.vars.as_slice() {
        return Err(Error::option(
            "varmap",
            format!(
                "the model's variables {:?} are not the scene's {:?}",
                guard.names(),
                scene.vars
            ),
        ));
    }
    let saved = |name: &str| {
        tensors.get(name).ok_or_else(|| {
            Error::option(
                "scene",
                format!(
                    "{} holds no `{name}` (left out by the guard's `include`?)",
                    dir.display()
                ),
            )
        })
    };
    for (name, var) in guard.names().iter().zip(guard.vars()) {
        let t = saved(&format!("param/{name}"))?;
        if t.dims() != var.dims() || t.dtype() != var.dtype() {
            return Err(Error::option(
                "varmap",
                format!(
                    "variable `{name}` is {:?} {:?}, the scene's {:?} {:?}",
                    var.dtype(),
                    var.dims(),
                    t.dtype(),
                    t.dims()
                ),
            ));
        }
        var.set(&t.to_device(var.device())?)?;
    }
    let mut opt = match &scene.optimizer {
        OptimizerRecord::Saved { spec, steps } => {
            let mut opt = guard.optimizer(spec.clone())?;
            let mut state = Vec::new();
            for (key, t) in &tensors {
                let Some(rest) = key.strip_prefix("optimizer/") else {
                    continue;
                };
                let (kind, name) = rest.split_once('.').unwrap_or((rest, ""));
                if let Some(i) = guard.names().iter().position(|n| n == name) {
                    state.push((format!("{kind}.{i}"), t.clone()));
                }
            }
            super::GuardOptimizer::restore(
                &mut opt,
                &SavedOptimizer {
                    spec: spec.clone(),
                    steps: *steps,
                    tensors: state,
                },
            )?;
            opt
        }
        OptimizerRecord::NotAvailable { name } => {
            let updates = scene.finding.phase == Phase::Update
                || scene.finding.kind == FindingKind::Divergence;
            if updates {
                return Err(Error::option(
                    "scene",
                    format!("the failure is in the update, but {name} keeps its state private, so the scene has none: guard nanhunt's optimizers (Guard::optimizer) to replay it"),
                ));
            }
            // The failure comes before the update: any optimizer does.
            guard.optimizer(OptimizerSpec::Sgd {
                lr: 0.0,
                momentum: 0.0,
                nesterov: false,
                weight_decay: 0.0,
            })?
        }
    };
    guard.tracker = scene.tracker.clone();
    guard.trace = scene.history.clone();
    guard.watch = crate::checks::explosion::JumpWatch::after(guard.init_norm, &guard.trace);
    let batch = Batch::new(
        scene
            .batch
            .iter()
            .map(|p| Ok((p.name.clone(), saved(&format!("batch/{}", p.name))?.clone())))
            .collect::<Result<Vec<_>>>()?,
    );
    let actual = match guard.step(scene.step, &batch, &mut opt, loss_of) {
        Ok(_) => None,
        Err(GuardError::Unstable { finding, .. }) => Some(*finding),
        Err(GuardError::Invalid(e)) => return Err(e),
    };
    let bit_identical = match (&actual, scene.recent_losses.last()) {
        (Some(f), Some(recorded)) if f.trace.losses.len() > scene.history.losses.len() => f
            .trace
            .losses
            .last()
            .map(|l| l.to_bits() == recorded.to_bits()),
        _ => None,
    };
    let message = match &actual {
        Some(f) if f.signature == expected && f.step == scene.step => {
            format!("reproduced: {expected} at step {}", scene.step)
        }
        Some(f) => format!(
            "fails differently: expected {expected} at step {}, got {} at step {}",
            scene.step, f.signature, f.step
        ),
        None => format!(
            "no longer fails: expected {expected} at step {}, but the step passed (fixed?)",
            scene.step
        ),
    };
    Ok(GuardReplay {
        expected,
        expected_step: scene.step,
        actual,
        bit_identical,
        message,
    })
}
