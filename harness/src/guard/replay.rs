//! Replaying a guard's scene: the state from before the failing step goes
//! back into the user's variables, the optimizer is rebuilt from its saved
//! state, and the step runs again on the saved batch through the user's own
//! loss closure. The scene and the judgement are the runner's
//! ([`crate::scene::SavedScene`]); only the driver differs. On the CPU the
//! finding and its loss come back bit for bit; a user's `cargo test` can
//! assert it.

use super::optim::SavedOptimizer;
use super::{Batch, Guard, GuardError, GuardOptions, NanhuntOptimizer};
use crate::error::{Error, Result};
use crate::finding::{Finding, FindingKind, Phase, ReplayReport};
use crate::scene::{OptimizerRecord, SavedScene};
use crate::spec::OptimizerSpec;
use candle_core::Tensor;
use std::path::Path;

/// What a replay of a guard's scene found (the one replay report).
pub type GuardReplay = ReplayReport;

/// Re-runs the failing step of the scene in `dir` with the variables of
/// `varmap` (the user's model, built as when the scene was written) and
/// the user's loss closure.
pub fn replay(
    dir: &Path,
    varmap: &candle_nn::VarMap,
    loss_of: impl FnMut(&Batch) -> candle_core::Result<Tensor>,
) -> Result<ReplayReport> {
    replay_changed(dir, varmap, &Changes::default(), loss_of)
}

/// A change to a scene's step, to test a fix on it (diagnose's).
#[derive(Clone, Debug, Default)]
pub(crate) struct Changes {
    /// The optimizer's learning rate.
    pub lr: Option<f64>,
    /// The optimizer's eps (Adam, AdamW, RMSprop).
    pub eps: Option<f64>,
    /// Variables (or module prefixes) declared frozen.
    pub frozen: Vec<String>,
    /// A stage guarded through the tracer.
    pub intervention: Option<crate::intervention::Intervention>,
    /// Batch rows left out.
    pub drop_rows: Vec<usize>,
}

/// [`replay`] with `changes` applied to the step.
pub(crate) fn replay_changed(
    dir: &Path,
    varmap: &candle_nn::VarMap,
    changes: &Changes,
    mut loss_of: impl FnMut(&Batch) -> candle_core::Result<Tensor>,
) -> Result<ReplayReport> {
    let mut scene = Restored::load(dir, varmap, changes)?;
    let actual = scene.step(scene.saved.scene.step, &mut loss_of)?;
    Ok(scene.saved.report(actual, &scene.guard.trace))
}

/// What training from a scene's state with a change did.
pub(crate) struct SceneTraining {
    /// The failing step replayed with the change.
    pub step: ReplayReport,
    /// The steps from the scene's, on its batch: `Stable` with their
    /// trace alone, or the first failure.
    pub outcome: crate::finding::Outcome,
}

/// Trains `steps` steps from the scene's state with `changes`, each on the
/// scene's batch (the only data a guard's scene holds): the first is the
/// failing step replayed; the rest say whether the change trains.
pub(crate) fn train_changed(
    dir: &Path,
    varmap: &candle_nn::VarMap,
    changes: &Changes,
    steps: usize,
    mut loss_of: impl FnMut(&Batch) -> candle_core::Result<Tensor>,
) -> Result<SceneTraining> {
    use crate::finding::Outcome;
    let mut scene = Restored::load(dir, varmap, changes)?;
    let first = scene.saved.scene.step;
    let mark = scene.guard.trace.mark();
    let actual = scene.step(first, &mut loss_of)?;
    let report = scene.saved.report(actual.clone(), &scene.guard.trace);
    let mut failure = actual;
    for step in first + 1..first + steps {
        if failure.is_some() {
            break;
        }
        failure = scene.step(step, &mut loss_of)?;
    }
    let outcome = match failure {
        Some(finding) => Outcome::Unstable {
            finding: Box::new(finding),
        },
        None => Outcome::Stable {
            trace: scene.guard.trace.since(mark),
        },
    };
    Ok(SceneTraining {
        step: report,
        outcome,
    })
}

/// A scene's state restored into the user's variables, with its optimizer
/// and batch, ready to step.
struct Restored {
    saved: SavedScene,
    guard: Guard,
    opt: NanhuntOptimizer,
    batch: Batch,
}

impl Restored {
    fn load(dir: &Path, varmap: &candle_nn::VarMap, changes: &Changes) -> Result<Restored> {
        let saved = SavedScene::load(dir)?;
        let scene = &saved.scene;
        let family = scene
            .finding
            .as_ref()
            .map_or_else(|| "user".to_string(), |f| f.signature.family.clone());
        let opts = GuardOptions::default()
            .named(family)
            .frozen(changes.frozen.clone());
        let mut guard = Guard::new(varmap, opts)?;
        // Variables match by name, in any order (a model's VarMap lists them
        // sorted; a scene, in the order its driver made them).
        let mut expected: Vec<&String> = scene
            .vars
            .iter()
            .filter(|n| !crate::coverage::declared_frozen(n, &changes.frozen))
            .collect();
        let mut names: Vec<&String> = guard.names().iter().collect();
        expected.sort();
        names.sort();
        if names != expected {
            return Err(Error::option(
                "varmap",
                format!(
                    "the model's variables {:?} are not the scene's {:?}",
                    guard.names(),
                    scene.vars
                ),
            ));
        }
        for (name, var) in guard.names().iter().zip(guard.vars()) {
            let t = saved.tensor(&format!("param/{name}"), var.as_tensor())?;
            var.set(&t.to_device(var.device())?)?;
        }
        let opt = optimizer(&saved, &guard, changes)?;
        guard.tracker = scene.tracker.clone();
        guard.trace = scene.history.clone();
        guard.watch = crate::checks::explosion::JumpWatch::after(guard.init_norm, &guard.trace);
        guard.intervention = changes.intervention.clone().map(std::sync::Arc::new);
        let batch = without_rows(saved.batch_parts()?, &changes.drop_rows)?;
        Ok(Restored {
            saved,
            guard,
            opt,
            batch,
        })
    }

    /// Step `step` on the scene's batch: its finding, if it failed.
    fn step(
        &mut self,
        step: usize,
        loss_of: &mut impl FnMut(&Batch) -> candle_core::Result<Tensor>,
    ) -> Result<Option<Finding>> {
        match self
            .guard
            .step(step, &self.batch, &mut self.opt, &mut *loss_of)
        {
            // A divergence's step comes back as its crossing of the line.
            Ok(_) => Ok(self.guard.crossing_finding(step, &self.opt)),
            Err(GuardError::Unstable { finding, .. }) => Ok(Some(*finding)),
            Err(GuardError::Invalid(e)) => Err(e),
        }
    }
}

/// The batch without rows `drop` (of every part whose first dimension is
/// the batch's).
fn without_rows(parts: Vec<(String, Tensor)>, drop: &[usize]) -> Result<Batch> {
    let Some(rows) = parts
        .first()
        .map(|(_, t)| t.dims().first().copied().unwrap_or(0))
    else {
        return Ok(Batch::new(parts));
    };
    if drop.is_empty() {
        return Ok(Batch::new(parts));
    }
    let keep: Vec<u32> = (0..rows as u32)
        .filter(|r| !drop.contains(&(*r as usize)))
        .collect();
    let device = parts[0].1.device().clone();
    let index = Tensor::from_vec(keep.clone(), keep.len(), &device)?;
    let parts = parts
        .into_iter()
        .map(|(n, t)| {
            let t = if t.dims().first() == Some(&rows) {
                t.index_select(&index, 0)?
            } else {
                t
            };
            Ok((n, t))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Batch::new(parts))
}

/// The optimizer of the scene: nanhunt's, restored from its saved state;
/// or, when its state was private, any (only a failure before the update
/// can be replayed then).
fn optimizer(saved: &SavedScene, guard: &Guard, changes: &Changes) -> Result<NanhuntOptimizer> {
    match &saved.scene.optimizer {
        OptimizerRecord::Saved { spec, steps } => {
            let mut spec = spec.clone();
            if let Some(lr) = changes.lr {
                spec.set_lr(lr);
            }
            if let (Some(eps), Some(e)) = (changes.eps, spec.eps_mut()) {
                *e = eps;
            }
            let mut opt = guard.optimizer(spec.clone())?;
            let mut tensors = Vec::new();
            for (i, name) in guard.names().iter().enumerate() {
                for (kind, t) in saved.optimizer_state(name) {
                    tensors.push((format!("{kind}.{i}"), t.clone()));
                }
            }
            let state = SavedOptimizer {
                spec,
                steps: *steps,
                tensors,
            };
            super::GuardOptimizer::restore(&mut opt, &state)?;
            Ok(opt)
        }
        OptimizerRecord::NotAvailable { name } => {
            let updates = saved
                .scene
                .finding
                .as_ref()
                .is_some_and(|f| f.phase == Phase::Update || f.kind == FindingKind::Divergence);
            if updates {
                return Err(Error::option(
                    "scene",
                    format!("the failure is in the update, but {name} keeps its state private, so the scene has none: guard nanhunt's optimizers (Guard::optimizer) to replay it"),
                ));
            }
            Ok(guard.optimizer(OptimizerSpec::Sgd {
                lr: 0.0,
                momentum: 0.0,
                nesterov: false,
                weight_decay: 0.0,
            })?)
        }
    }
}
