//! `replay`: re-run a crash dump's failing step from its saved state, or a
//! reproducer's case from the start, and say whether the recorded signature
//! comes back.

use crate::dump::Dump;
use crate::error::{Error, Result};
use crate::finding::{Finding, Outcome, Signature};
use crate::models::{factory_for, BuiltinFactory, ModelFactory};
use crate::repro::Reproducer;
use crate::runner::{RunOptions, Session, Snapshot};
use crate::training::run_model;
use serde::Serialize;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayVerdict {
    /// The recorded signature came back.
    Reproduced,
    /// The case now trains stably: whatever caused the failure is fixed.
    Fixed,
    /// It still fails, but differently.
    Different,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub verdict: ReplayVerdict,
    /// The recorded signature; `None` for a healthy step's dump.
    pub expected: Option<Signature>,
    pub expected_step: usize,
    /// The failure seen now, if any.
    pub actual: Option<Finding>,
    /// Dumps only: whether the failing step's loss has the recorded bits.
    pub bit_identical: Option<bool>,
    pub message: String,
}

impl ReplayReport {
    fn new(
        expected: Option<Signature>,
        expected_step: usize,
        actual: Option<Finding>,
        bit_identical: Option<bool>,
    ) -> Self {
        let verdict = match (&expected, &actual) {
            (None, None) => ReplayVerdict::Reproduced,
            (Some(_), None) => ReplayVerdict::Fixed,
            (Some(e), Some(f)) if f.signature == *e && f.step == expected_step => {
                ReplayVerdict::Reproduced
            }
            (_, Some(_)) => ReplayVerdict::Different,
        };
        let recorded = expected
            .as_ref()
            .map_or_else(|| "a healthy step".to_string(), |e| e.to_string());
        let message = match (&verdict, &actual) {
            (ReplayVerdict::Reproduced, _) => format!("reproduced: {recorded} at step {expected_step}"),
            (ReplayVerdict::Fixed, _) => format!(
                "no longer fails: expected {recorded} at step {expected_step}, but training stayed stable (fixed?)"
            ),
            (_, Some(f)) => format!(
                "fails differently: expected {recorded} at step {expected_step}, got {} at step {}",
                f.signature, f.step
            ),
            (_, None) => unreachable!("a different failure has a finding"),
        };
        ReplayReport {
            verdict,
            expected,
            expected_step,
            actual,
            bit_identical,
            message,
        }
    }

    pub fn reproduced(&self) -> bool {
        self.verdict == ReplayVerdict::Reproduced && self.bit_identical != Some(false)
    }
}

/// Replays a dump directory or a reproducer file (built-in families).
pub fn replay_path(path: &Path) -> Result<ReplayReport> {
    replay_path_with(path, None)
}

/// Like [`replay_path`], with the factory of a user's own model.
pub fn replay_path_with(path: &Path, factory: Option<&dyn ModelFactory>) -> Result<ReplayReport> {
    if path.is_dir() {
        replay_dump(path, factory)
    } else {
        replay_reproducer(&Reproducer::load(path)?, factory)
    }
}

/// Restores a dump's saved state and re-runs only the failing step, on
/// the batch the dump saved (no data file or generator is needed; dumps
/// from before batches were saved regenerate it).
pub fn replay_dump(dir: &Path, factory: Option<&dyn ModelFactory>) -> Result<ReplayReport> {
    let dump = Dump::load(dir, &candle_core::Device::Cpu)?;
    let builtin = BuiltinFactory::new(&dump.case.model);
    let factory = factory_for(&dump.case, factory, &builtin)?;
    let opts = RunOptions::default();
    let mut session = match dump.saved_batch()? {
        Some(batch) => {
            let saved = crate::data::Saved {
                step: dump.stats.step,
                batch,
            };
            Session::with_source(&dump.case, factory, &opts, Box::new(saved))?
        }
        None => Session::new(&dump.case, factory, &opts)?,
    };
    let snapshot = snapshot_of(&dump, &session)?;
    session.set_history(dump.stats.resume.trace.clone());
    session.restore(&snapshot)?;
    let step = dump.stats.step;
    let actual = match session.step(step)? {
        Some(f) => Some(f),
        // On an accelerator the step's update is checked at the next copy.
        None => match session.finish()? {
            Some(f) => Some(f),
            // An explosion's step comes back as its jump.
            None => session.jump_finding().filter(|f| f.step == step),
        },
    };
    let trace = actual.as_ref().map_or(session.trace(), |f| &f.trace);
    let bit_identical = match (trace.losses.last(), dump.stats.recent_losses.last()) {
        (Some(now), Some(recorded)) => Some(now.to_bits() == recorded.to_bits()),
        _ => None,
    };
    Ok(ReplayReport::new(
        dump.stats.finding.as_ref().map(|f| f.signature.clone()),
        step,
        actual,
        bit_identical,
    ))
}

/// The session state saved in a dump.
fn snapshot_of(dump: &Dump, session: &Session) -> Result<Snapshot> {
    let (names, vars) = session.vars();
    let mut params = Vec::with_capacity(names.len());
    // Dumps load on the CPU; the state moves to the session's device.
    let device = session.params().device().clone();
    let mut state = std::collections::HashMap::new();
    for (name, var) in names.iter().zip(vars) {
        let t = dump.tensor(&format!("param/{name}"), var.as_tensor())?;
        params.push(t.to_device(&device)?);
        // The optimizer's state of a parameter has the parameter's shape and dtype.
        for kind in crate::optim::STATE_KINDS {
            let key = format!("{kind}.{name}");
            if dump.tensors.contains_key(&format!("optimizer/{key}")) {
                let t = dump.tensor(&format!("optimizer/{key}"), var.as_tensor())?;
                state.insert(key, t.to_device(&device)?);
            }
        }
    }
    let mut optimizer = crate::optim::Optimizer::new(&session.case().optimizer, names.len());
    optimizer.restore(dump.stats.resume.optimizer_steps, names, |n| {
        state.remove(n)
    });
    Ok(Snapshot {
        params,
        optimizer,
        scaler: dump.stats.resume.scaler.clone(),
        tracker: dump.stats.resume.tracker.clone(),
        history: dump.stats.resume.trace.mark(),
    })
}

/// Runs a reproducer's case from the start.
pub fn replay_reproducer(
    repro: &Reproducer,
    factory: Option<&dyn ModelFactory>,
) -> Result<ReplayReport> {
    let builtin = BuiltinFactory::new(&repro.case.model);
    let factory = factory_for(&repro.case, factory, &builtin)?;
    let actual = match run_model(&repro.case, factory, &RunOptions::default())? {
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
