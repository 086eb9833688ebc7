//! Does a finding survive higher precision and reference rounding?
//!
//! A finding at half precision or f32 can hang on candle's numerics rather
//! than on the model: an f16 accumulator where PyTorch accumulates in f32,
//! a backward formula that overflows where another order of operations
//! does not, an exact 0.0 where other libraries' summation order leaves
//! ±1e-11 of noise (and Adam with eps 0 then divides 0 by 0). The failing
//! step is re-run from the state before it — parameters and optimizer
//! state converted, the same batch — in f32 for a half-precision case and
//! in f64, and the finding carries the outcome. `docs/NUMERICS.md` lists
//! the known places where candle's rules differ from PyTorch's.

use crate::error::Result;
pub use crate::finding::{
    CandleRule, FrameworkMark, FrameworkVerdict, PrecisionCheck, Rerun, Robustness,
};
use crate::finding::{Finding, FindingKind, Phase, Zeros};
use crate::intervention::Intervention;
use crate::models::{ModelFactory, Tracer};
use crate::runner::{RunOptions, Session, Snapshot};
use crate::spec::{Case, HalfType, Precision};
use candle_core::DType;
use std::sync::Arc;

/// Re-runs `finding`'s step from `before` at the higher precisions (the
/// check itself is the guard's too: `checks::precision`).
pub fn check(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
    finding: &Finding,
    before: &Snapshot,
) -> Result<PrecisionCheck> {
    let driver = SessionRerun {
        case,
        factory,
        opts,
        finding,
        before,
    };
    crate::checks::precision::check(finding, case.precision.compute_dtype(), &driver)
}

/// The runner's re-run of a failing step: a session of the case at the
/// other precision, restored to the state before the step.
struct SessionRerun<'a> {
    case: &'a Case,
    factory: &'a dyn ModelFactory,
    opts: &'a RunOptions,
    finding: &'a Finding,
    before: &'a Snapshot,
}

impl crate::checks::precision::Rerunner for SessionRerun<'_> {
    fn rerun(&self, dtype: DType, storage: Option<HalfType>) -> Result<(Rerun, Option<Zeros>)> {
        let (case, factory, opts, finding, before) = (
            self.case,
            self.factory,
            self.opts,
            self.finding,
            self.before,
        );
        match storage {
            Some(h) => Ok((
                with_pytorch_rounding(case, factory, opts, finding, before, h)?,
                None,
            )),
            None if dtype == DType::F64 => {
                rerun(case, factory, opts, finding, before, Precision::F64)
            }
            None => rerun(case, factory, opts, finding, before, Precision::F32),
        }
    }
}

/// The failing step with PyTorch's half-precision numerics, as far as
/// stages show them: computed in f32, every stage's output and gradient
/// stored in `half` (PyTorch computes each op in f32 and rounds its
/// result; candle computes it in the half dtype, and accumulates there).
fn with_pytorch_rounding(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
    finding: &Finding,
    before: &Snapshot,
    half: HalfType,
) -> Result<Rerun> {
    let name = half.stored_in_f32_name();
    let scaled = case
        .precision
        .loss_scaling()
        .is_some_and(|s| !matches!(s, crate::spec::LossScaling::None));
    // A divergence is judged on the loss, which scaling leaves alone.
    let after_the_loss = (matches!(finding.phase, Phase::Backward | Phase::Update)
        && finding.kind != FindingKind::Divergence)
        || finding.kind == FindingKind::ScaleCollapse;
    if scaled && after_the_loss {
        return Ok(Rerun::not_run(&name, "its loss scaling is not emulated"));
    }
    // torch.optim updates half-precision parameters in their dtype; under
    // autocast the master weights and their update stay in f32.
    let half_update = matches!(case.precision, Precision::F16 | Precision::Bf16);
    let storage = Intervention {
        storage: Some(half),
        half_update,
        ..match &opts.intervention {
            Some(iv) => (**iv).clone(),
            None => Intervention::storage(half),
        }
    };
    let opts = RunOptions {
        intervention: Some(Arc::new(storage)),
        ..opts.clone()
    };
    let mut session = match restored(case, factory, &opts, finding, before, Precision::F32)? {
        Ok(s) => s,
        Err(why) => return Ok(Rerun::not_run(&name, why)),
    };
    let tracer = Tracer::on().with_intervention(opts.intervention.clone());
    if forward_stage_fails(&session, finding, tracer)? {
        return Ok(Rerun::ran(&name, finding, Some(finding), None));
    }
    let mut run = stepped(&mut session, &name, finding);
    if half_update && finding.phase == Phase::Update {
        let dtype = half.dtype().as_str();
        run.note = format!(
            "{}; the update in {dtype}, as torch.optim computes it on {dtype} parameters",
            run.note
        );
    }
    Ok(run)
}

/// The failing step at `precision`; with f64, also the exact zeros of the
/// failing parameter's gradient for a NaN in the update.
fn rerun(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
    finding: &Finding,
    before: &Snapshot,
    precision: Precision,
) -> Result<(Rerun, Option<Zeros>)> {
    let name = precision.name();
    let master = precision.master_dtype();
    let mut session = match restored(case, factory, opts, finding, before, precision)? {
        Ok(s) => s,
        Err(why) => return Ok((Rerun::not_run(name, why), None)),
    };
    let zeros = if master == DType::F64 {
        exact_zero_gradients(&session, finding).ok().flatten()
    } else {
        None
    };
    Ok((stepped(&mut session, name, finding), zeros))
}

/// A session of `case` at `precision` in the state before the finding's
/// step, or why it cannot be built.
fn restored<'a>(
    case: &Case,
    factory: &'a dyn ModelFactory,
    opts: &RunOptions,
    finding: &Finding,
    before: &Snapshot,
    precision: Precision,
) -> Result<std::result::Result<Session<'a>, String>> {
    let mut case = case.clone();
    case.precision = precision;
    let opts = RunOptions {
        dump: None,
        dump_at: None,
        fidelity: false,
        ..opts.clone()
    };
    let mut session = match Session::new(&case, factory, &opts) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let snapshot = match converted(before, case.precision.master_dtype(), &case) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e.to_string())),
    };
    session.set_history(finding.trace.upto(before.history));
    session.restore(&snapshot)?;
    Ok(Ok(session))
}

/// The finding's step run again on `session`, judged against the finding.
fn stepped(session: &mut Session, name: &str, finding: &Finding) -> Rerun {
    // A divergence's step comes back as its crossing of the line.
    let seen = match session.step(finding.step).and_then(|f| match f {
        Some(f) => Ok(Some(f)),
        None => Ok(session.finish()?.or_else(|| session.crossing_finding())),
    }) {
        Ok(seen) => seen,
        Err(e) => return Rerun::not_run(name, e),
    };
    // An explosion is a jump at its step (its never-recovered half is judged
    // over the whole run, not one step).
    let jump = session
        .jump()
        .filter(|j| finding.kind == FindingKind::Explosion && j.step == finding.step);
    Rerun::ran(name, finding, seen.as_ref(), jump)
}

/// Whether the finding's forward stage fails again (NaN again, or an
/// infinity again) in a traced forward pass under `tracer`'s
/// intervention: a stage past the half range that later ops hide (a variance of Inf whose normalized output is
/// silently 0) leaves the loss finite, so the step alone would not say.
fn forward_stage_fails(session: &Session, finding: &Finding, mut tracer: Tracer) -> Result<bool> {
    if finding.phase != Phase::Forward {
        return Ok(false);
    }
    let Ok(batch) = session.batch(finding.step)? else {
        return Ok(false);
    };
    let shared = crate::models::tracer::share(&tracer);
    let forward = session.forward_loss(&batch, &mut tracer);
    drop(shared);
    forward?;
    let records = tracer.records();
    let Some(r) = records.iter().find(|r| r.name == finding.stage) else {
        return Ok(false);
    };
    // The same failure: NaN for a NaN, an infinity for an overflow (a
    // mask of −inf is what PyTorch's rounding makes of f32::MIN).
    let scan = &crate::probe::scan_all(&[&r.output])?[0];
    Ok(match finding.kind {
        FindingKind::Nan => scan.nan > 0,
        FindingKind::Inf | FindingKind::Overflow => scan.inf > 0,
        _ => false,
    })
}

/// `before` with its parameters and optimizer state in `dtype`.
fn converted(before: &Snapshot, dtype: DType, case: &Case) -> Result<Snapshot> {
    Ok(Snapshot {
        params: before
            .params
            .iter()
            .map(|t| t.to_dtype(dtype))
            .collect::<candle_core::Result<_>>()?,
        optimizer: before.optimizer.to_dtype(dtype)?,
        // Full precision has no loss scaling.
        scaler: crate::scaler::LossScaler::new(case.precision.loss_scaling()),
        tracker: before.tracker.clone(),
        history: before.history,
    })
}

/// The exactly-zero elements of the gradient of the parameter a NaN in
/// the update names (`param.<name>` or `optimizer.<kind>.<name>`), at the
/// session's current state and the finding's batch, and how many are
/// structural.
fn exact_zero_gradients(session: &Session, finding: &Finding) -> Result<Option<Zeros>> {
    let (names, vars) = session.vars();
    let Some(i) = finding.nan_update_param(names) else {
        return Ok(None);
    };
    let Ok(batch) = session.batch(finding.step)? else {
        return Ok(None);
    };
    crate::checks::precision::zero_gradients(vars, i, || {
        Ok(session.forward_loss(&batch, &mut Tracer::off())?.loss)
    })
}
