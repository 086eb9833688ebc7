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
use crate::finding::{Finding, FindingKind};
pub use crate::finding::{PrecisionCheck, Rerun, Robustness};
use crate::models::{ModelFactory, Tracer};
use crate::runner::{RunOptions, Session, Snapshot};
use crate::spec::{Case, Precision};
use candle_core::DType;

/// Re-runs `finding`'s step from `before` at the higher precisions.
pub fn check(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
    finding: &Finding,
    before: &Snapshot,
) -> Result<PrecisionCheck> {
    let compute = case.precision.compute_dtype();
    if compute == DType::F64 {
        return Ok(PrecisionCheck::in_f64());
    }
    let f32_run = match compute {
        DType::F16 | DType::BF16 => {
            Some(rerun(case, factory, opts, finding, before, Precision::F32)?.0)
        }
        _ => None,
    };
    let (f64_run, zeros) = rerun(case, factory, opts, finding, before, Precision::F64)?;
    Ok(PrecisionCheck::of(f32_run, f64_run, zeros))
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
) -> Result<(Rerun, Option<usize>)> {
    let name = precision.name();
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
        Err(e) => return Ok((Rerun::not_run(name, e), None)),
    };
    let dtype = case.precision.master_dtype();
    let snapshot = match converted(before, dtype, &case) {
        Ok(s) => s,
        Err(e) => return Ok((Rerun::not_run(name, e), None)),
    };
    session.set_history(finding.trace.upto(before.history));
    session.restore(&snapshot)?;
    let zeros = if dtype == DType::F64 {
        exact_zero_gradients(&session, finding).ok().flatten()
    } else {
        None
    };
    // A divergence's step comes back as its crossing of the line.
    let seen = match session.step(finding.step).and_then(|f| match f {
        Some(f) => Ok(Some(f)),
        None => Ok(session.finish()?.or_else(|| session.crossing_finding())),
    }) {
        Ok(seen) => seen,
        Err(e) => return Ok((Rerun::not_run(name, e), None)),
    };
    // An explosion is a jump at its step (its never-recovered half is judged
    // over the whole run, not one step).
    let jump = session
        .jump()
        .filter(|j| finding.kind == FindingKind::Explosion && j.step == finding.step);
    Ok((Rerun::ran(name, finding, seen.as_ref(), jump), zeros))
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
/// session's current state and the finding's batch.
fn exact_zero_gradients(session: &Session, finding: &Finding) -> Result<Option<usize>> {
    let (names, vars) = session.vars();
    let Some(i) = finding.nan_update_param(names) else {
        return Ok(None);
    };
    let Ok(batch) = session.batch(finding.step)? else {
        return Ok(None);
    };
    let loss = session.forward_loss(&batch, &mut Tracer::off())?.loss;
    let grads = loss.backward()?;
    let Some(g) = grads.get(vars[i].as_tensor()) else {
        return Ok(None);
    };
    Ok(Some(crate::probe::exact_zeros(g)?))
}
