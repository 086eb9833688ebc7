//! `replay`: re-run a crash dump's failing step from its saved state, or a
//! reproducer's case from the start, and say whether the recorded signature
//! comes back.

use crate::error::{Error, Result};
use crate::finding::Outcome;
pub use crate::finding::{ReplayReport, ReplayVerdict};
use crate::models::{factory_for, BuiltinFactory, ModelFactory};
use crate::repro::Reproducer;
use crate::runner::{RunOptions, Session, Snapshot};
use crate::scene::{OptimizerRecord, SavedScene};
use crate::training::run_model;
use std::path::Path;

/// Replays `path`: a scene directory (a run's dump, a hunt's reproducer:
/// its failing step re-run from its saved state, on the batch it saved) or
/// a reproducer file (its case run from the start), and says whether the
/// recorded signature came back. `factory` builds a user's own model (a
/// built-in family, or the process's registered model, needs none);
/// `opts` carries a user's dataset or loss closure the case names
/// (`RunOptions::with_dataset`, `with_loss`). A guard's scene (a user's own
/// loop) is replayed with `nanhunt::guard::replay` and the model.
///
/// ```no_run
/// use nanhunt::replay::{replay, ReplayVerdict};
/// let report = replay("scene/".as_ref(), None, &nanhunt::RunOptions::default())?;
/// assert_eq!(report.verdict, ReplayVerdict::Reproduced, "{}", report.message);
/// # Ok::<(), nanhunt::Error>(())
/// ```
pub fn replay(
    path: &Path,
    factory: Option<&dyn ModelFactory>,
    opts: &RunOptions,
) -> Result<ReplayReport> {
    if path.is_dir() {
        replay_scene(path, factory, opts)
    } else {
        replay_case(&Reproducer::load(path)?, factory, opts)
    }
}

/// A scene's saved state restored and its step re-run (dumps from before
/// batches were saved regenerate the batch). The scene and the judgement
/// are the guard's too ([`SavedScene`]); only the driver differs.
pub(crate) fn replay_scene(
    dir: &Path,
    factory: Option<&dyn ModelFactory>,
    opts: &RunOptions,
) -> Result<ReplayReport> {
    let saved = SavedScene::load(dir)?;
    let case = saved.case.clone().ok_or_else(|| {
        Error::malformed(
            crate::error::Document::Dump,
            &dir.join(crate::scene::CASE_FILE),
            "missing: this is the scene of a user's own loop; replay it with `nanhunt::guard::replay` and the model"
                .to_string(),
        )
    })?;
    let builtin = BuiltinFactory::new(&case.model);
    let factory = factory_for(&case, factory, &builtin)?;
    let opts = RunOptions {
        dump: None,
        dump_at: None,
        ..opts.clone()
    };
    let mut session = match saved.source_batch(&case)? {
        Some(batch) => {
            let source = crate::data::Saved {
                step: saved.scene.step,
                batch,
            };
            Session::with_source(&case, factory, &opts, Box::new(source))?
        }
        None => Session::new(&case, factory, &opts)?,
    };
    let snapshot = snapshot_of(&saved, &session)?;
    session.set_history(saved.scene.history.clone());
    session.restore(&snapshot)?;
    let step = saved.scene.step;
    let actual = match session.step(step)? {
        Some(f) => Some(f),
        // On an accelerator the step's update is checked at the next copy.
        None => match session.finish()? {
            Some(f) => Some(f),
            // An explosion's step comes back as its jump, a divergence's
            // as its crossing of the line.
            None => session
                .jump_finding()
                .or_else(|| session.crossing_finding())
                .filter(|f| f.step == step),
        },
    };
    Ok(saved.report(actual, session.trace()))
}

/// The session state saved in a scene.
fn snapshot_of(saved: &SavedScene, session: &Session) -> Result<Snapshot> {
    let (names, vars) = session.vars();
    let mut params = Vec::with_capacity(names.len());
    // Scenes load on the CPU; the state moves to the session's device.
    let device = session.params().device().clone();
    let mut state = std::collections::HashMap::new();
    for (name, var) in names.iter().zip(vars) {
        let t = saved.tensor(&format!("param/{name}"), var.as_tensor())?;
        params.push(t.to_device(&device)?);
        // The optimizer's state of a parameter has the parameter's shape and dtype.
        for (kind, _) in saved.optimizer_state(name) {
            let key = format!("{kind}.{name}");
            let t = saved.tensor(&format!("optimizer/{key}"), var.as_tensor())?;
            state.insert(key, t.to_device(&device)?);
        }
    }
    let case = session.case();
    let steps = match &saved.scene.optimizer {
        OptimizerRecord::Saved { steps, .. } => *steps,
        OptimizerRecord::NotAvailable { .. } => 0,
    };
    let mut optimizer = crate::optim::Optimizer::new(&case.optimizer, names.len());
    optimizer.restore(steps, names, |n| state.remove(n));
    Ok(Snapshot {
        params,
        optimizer,
        scaler: saved
            .scene
            .scaler
            .clone()
            .unwrap_or_else(|| crate::scaler::LossScaler::new(case.precision.loss_scaling())),
        tracker: saved.scene.tracker.clone(),
        history: saved.scene.history.mark(),
    })
}

/// A reproducer's case run from the start.
pub(crate) fn replay_case(
    repro: &Reproducer,
    factory: Option<&dyn ModelFactory>,
    opts: &RunOptions,
) -> Result<ReplayReport> {
    let builtin = BuiltinFactory::new(&repro.case.model);
    let factory = factory_for(&repro.case, factory, &builtin)?;
    let opts = RunOptions {
        dump: None,
        dump_at: None,
        ..opts.clone()
    };
    let actual = match run_model(&repro.case, factory, &opts)? {
        Outcome::Unstable { finding } => Some(*finding),
        Outcome::Stable { .. } => None,
        Outcome::Rejected { reason } => return Err(Error::Rejected(reason)),
    };
    Ok(ReplayReport::new(
        Some(repro.expected.signature.clone()),
        repro.expected.step,
        actual,
        None,
    ))
}
