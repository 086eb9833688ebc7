//! The precision check of a guard's finding, as the runner's
//! ([`crate::fidelity`]): the failing step re-run from the state before it
//! — parameters and optimizer state converted, the same batch — in f32 (for
//! a half-precision loop) and in f64, here through a second guard over the
//! model the user's [`Rebuild`](super::Rebuild) builds at that precision.
//! Which re-runs a check takes, the verdict and the re-runs' notes are the
//! runner's ([`crate::checks::precision`], [`Rerun::ran`]).

use super::optim::SavedOptimizer;
use super::state::Before;
use super::{Batch, Guard, GuardError, GuardOptions, Rebuild};
use crate::error::Result;
use crate::finding::{
    Finding, FindingKind, FrameworkMark, PrecisionCheck, Rerun, Robustness, Zeros,
};
use crate::intervention::Intervention;
use crate::spec::{HalfType, OptimizerSpec, PrecisionKind};
use candle_core::{DType, Tensor};

impl Guard {
    /// The finding's precision check; "not checked" when the guard cannot
    /// build the model at another precision.
    pub(super) fn precision_check(
        &self,
        finding: &Finding,
        before: &Before,
        batch: &Batch,
    ) -> Result<PrecisionCheck> {
        let dtype = self.vars[0].dtype();
        let half = HalfType::of_dtype(dtype);
        const NO_REBUILD: &str =
            "the guard cannot build the model at another precision (give it GuardOptions::rebuild)";
        let Some(rebuild) = &self.opts.rebuild.as_ref().filter(|_| dtype != DType::F64) else {
            if dtype == DType::F64 {
                let mut check = PrecisionCheck::in_f64();
                check.framework = Some(FrameworkMark::of(finding, &check, None));
                return Ok(check);
            }
            let mut check = PrecisionCheck {
                verdict: Robustness::NotChecked,
                reruns: vec![Rerun::not_run("f64", NO_REBUILD)],
                exact_zero_gradients: None,
                structural_zero_gradients: None,
                framework: None,
            };
            let emulated = half.map(|h| Rerun::not_run(&h.stored_in_f32_name(), NO_REBUILD));
            check.framework = Some(FrameworkMark::of(finding, &check, emulated.as_ref()));
            return Ok(check);
        };
        let driver = GuardRerun {
            guard: self,
            rebuild,
            finding,
            before,
            batch,
        };
        crate::checks::precision::check(finding, dtype, &driver)
    }

    /// The failing step in `dtype`, on the rebuilt model, with every
    /// stage stored in `storage` when given (PyTorch's half-precision
    /// rounding, for the framework mark); with f64, also the exact zeros
    /// of the failing parameter's gradient for a NaN in the update.
    fn rerun(
        &self,
        rebuild: &Rebuild,
        dtype: DType,
        storage: Option<HalfType>,
        finding: &Finding,
        before: &Before,
        batch: &Batch,
    ) -> Result<(Rerun, Option<Zeros>)> {
        let name = match storage {
            Some(h) => h.stored_in_f32_name(),
            None => PrecisionKind::of_dtype(dtype).name().to_string(),
        };
        let name = name.as_str();
        let mut rebuilt = match rebuild(dtype) {
            Ok(r) => r,
            Err(e) => return Ok((Rerun::not_run(name, e), None)),
        };
        let opts = GuardOptions {
            dump: None,
            rebuild: None,
            ..self.opts.clone()
        };
        // The rebuilt variables in the guarded order, by name.
        let rebuilt_vars = rebuilt
            .varmap
            .data()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(named) = self
            .names
            .iter()
            .map(|n| rebuilt_vars.get(n).map(|v| (n.clone(), v.clone())))
            .collect::<Option<Vec<_>>>()
        else {
            let mut theirs: Vec<&String> = rebuilt_vars.keys().collect();
            theirs.sort();
            let why = format!(
                "the rebuilt model's variables {theirs:?} are not the guarded {:?}",
                self.names
            );
            return Ok((Rerun::not_run(name, why), None));
        };
        let mut guard = Guard::with_vars(named, opts)?;
        guard.intervention = storage.map(|h| std::sync::Arc::new(Intervention::storage(h)));
        // The variables hold the state before the step (restored).
        for (v, mine) in guard.vars.iter().zip(&self.vars) {
            v.set(&mine.as_tensor().to_dtype(dtype)?)?;
        }
        let Some(spec) = rerun_optimizer(before.optimizer.as_ref(), finding) else {
            let why = "the failure is in the update and the optimizer's state is private";
            return Ok((Rerun::not_run(name, why), None));
        };
        let mut opt = guard.optimizer(spec)?;
        if let Some(saved) = &before.optimizer {
            super::GuardOptimizer::restore(&mut opt, &converted(saved, dtype)?)?;
        }
        guard.tracker = before.tracker.clone();
        guard.trace = self.trace.upto(before.history);
        guard.watch = crate::checks::explosion::JumpWatch::after(guard.init_norm, &guard.trace);
        let batch = batch_in(batch, dtype)?;
        let zeros = match (dtype, finding.nan_update_param(&self.names)) {
            (DType::F64, Some(i)) => {
                crate::checks::precision::zero_gradients(&guard.vars, i, || {
                    Ok((rebuilt.loss)(&batch)?)
                })?
            }
            _ => None,
        };
        let seen = match guard.step(finding.step, &batch, &mut opt, &mut rebuilt.loss) {
            // A divergence's step comes back as its crossing of the line.
            Ok(_) if finding.kind == FindingKind::Divergence => {
                guard.crossing_finding(finding.step, &opt)
            }
            Ok(_) => None,
            Err(GuardError::Unstable { finding, .. }) => Some(*finding),
            Err(GuardError::Invalid(e)) => return Ok((Rerun::not_run(name, e), None)),
        };
        let jump = guard
            .pending
            .jump()
            .filter(|j| finding.kind == FindingKind::Explosion && j.step == finding.step);
        Ok((Rerun::ran(name, finding, seen.as_ref(), jump), zeros))
    }
}

/// The optimizer to re-run the step with: the saved one's spec, or (its
/// The guard's re-run of a failing step: a second guard over the model
/// the user's [`Rebuild`] builds at the other precision.
struct GuardRerun<'a> {
    guard: &'a Guard,
    rebuild: &'a Rebuild,
    finding: &'a Finding,
    before: &'a Before,
    batch: &'a Batch,
}

impl crate::checks::precision::Rerunner for GuardRerun<'_> {
    fn rerun(&self, dtype: DType, storage: Option<HalfType>) -> Result<(Rerun, Option<Zeros>)> {
        self.guard.rerun(
            self.rebuild,
            dtype,
            storage,
            self.finding,
            self.before,
            self.batch,
        )
    }
}

/// state private) any, when the failure comes before the update.
fn rerun_optimizer(saved: Option<&SavedOptimizer>, finding: &Finding) -> Option<OptimizerSpec> {
    match saved {
        Some(s) => Some(s.spec.clone()),
        None if finding.phase == crate::finding::Phase::Update
            || finding.kind == FindingKind::Divergence =>
        {
            None
        }
        None => Some(OptimizerSpec::Sgd {
            lr: 0.0,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }),
    }
}

/// A saved optimizer's state in `dtype`.
fn converted(saved: &SavedOptimizer, dtype: DType) -> Result<SavedOptimizer> {
    Ok(SavedOptimizer {
        spec: saved.spec.clone(),
        steps: saved.steps,
        tensors: saved
            .tensors
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.to_dtype(dtype)?)))
            .collect::<Result<_>>()?,
    })
}

/// The batch with its float tensors in `dtype`.
fn batch_in(batch: &Batch, dtype: DType) -> Result<Batch> {
    let parts = batch
        .parts()
        .iter()
        .map(|(n, t)| {
            let t: Tensor = if t.dtype().is_float() {
                t.to_dtype(dtype)?
            } else {
                t.clone()
            };
            Ok((n.clone(), t))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Batch::new(parts))
}
