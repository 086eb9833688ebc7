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
use crate::models::{ModelFactory, Tracer};
use crate::outcome::{Finding, FindingKind, Phase};
use crate::runner::{RunOptions, Session, Snapshot};
use crate::spec::{Case, Precision};
use candle_core::DType;
use serde::{Deserialize, Serialize};

/// What the re-runs say about a finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Robustness {
    /// Gone in f32 and in f64: it hangs on the lower precision's range or
    /// rounding (and on how candle computes there).
    PrecisionDependent,
    /// Back in f32, gone in f64.
    ReproducesInF32,
    /// Back in f64 (or the case runs in f64).
    ReproducesInF64,
    /// Back in f64, but it is 0/0 on gradient elements that are exactly
    /// 0.0: zero in exact arithmetic, they can come out as tiny noise
    /// under another library's summation order, and the finding with them.
    HangsOnExactZeros,
    /// The re-runs could not run (the model does not run in f64, say).
    NotChecked,
}

impl Robustness {
    pub fn as_str(self) -> &'static str {
        match self {
            Robustness::PrecisionDependent => "precision-dependent",
            Robustness::ReproducesInF32 => "reproduces in f32",
            Robustness::ReproducesInF64 => "reproduces in f64",
            Robustness::HangsOnExactZeros => "hangs on exact zeros",
            Robustness::NotChecked => "not checked at higher precision",
        }
    }
}

/// One re-run of the failing step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rerun {
    pub precision: String,
    /// The step could be run at this precision.
    pub ran: bool,
    /// The step failed again.
    pub reproduced: bool,
    /// What it showed: the failure seen, or why it could not run.
    pub note: String,
}

/// A finding's precision check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrecisionCheck {
    pub verdict: Robustness,
    pub reruns: Vec<Rerun>,
    /// For a NaN in the update: the elements of the failing parameter's
    /// gradient that are exactly 0.0 in the f64 re-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_zero_gradients: Option<usize>,
}

impl PrecisionCheck {
    /// One line for reports: the verdict and the re-runs.
    pub fn summary(&self) -> String {
        let runs: Vec<String> = self
            .reruns
            .iter()
            .map(|r| format!("{}: {}", r.precision, r.note))
            .collect();
        let zeros = match self.exact_zero_gradients {
            Some(n) if self.verdict == Robustness::HangsOnExactZeros => {
                format!("; 0/0 on {n} gradient elements that are exactly 0.0")
            }
            _ => String::new(),
        };
        format!("{} ({}{zeros})", self.verdict.as_str(), runs.join("; "))
    }
}

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
        return Ok(PrecisionCheck {
            verdict: Robustness::ReproducesInF64,
            reruns: Vec::new(),
            exact_zero_gradients: None,
        });
    }
    let f32_run = match compute {
        DType::F16 | DType::BF16 => {
            Some(rerun(case, factory, opts, finding, before, Precision::F32)?.0)
        }
        _ => None,
    };
    let (f64_run, zeros) = rerun(case, factory, opts, finding, before, Precision::F64)?;
    let ran = |r: Option<&Rerun>| r.filter(|r| r.ran).map(|r| r.reproduced);
    let verdict = match (ran(f32_run.as_ref()), ran(Some(&f64_run))) {
        (_, Some(true)) => match zeros {
            Some(n) if n > 0 => Robustness::HangsOnExactZeros,
            _ => Robustness::ReproducesInF64,
        },
        (Some(true), _) => Robustness::ReproducesInF32,
        (None, None) => Robustness::NotChecked,
        _ => Robustness::PrecisionDependent,
    };
    let reruns = f32_run.into_iter().chain([f64_run]).collect();
    Ok(PrecisionCheck {
        verdict,
        reruns,
        exact_zero_gradients: zeros,
    })
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
    let name = precision.name().to_string();
    let not_run = |e: crate::error::Error| {
        Ok((
            Rerun {
                precision: name.clone(),
                ran: false,
                reproduced: false,
                note: format!("could not run: {e}"),
            },
            None,
        ))
    };
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
        Err(e) => return not_run(e),
    };
    let dtype = case.precision.master_dtype();
    let converted = (|| -> Result<Snapshot> {
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
    })();
    let snapshot = match converted {
        Ok(s) => s,
        Err(e) => return not_run(e),
    };
    session.set_history(finding.trace.upto(before.history));
    session.restore(&snapshot)?;
    let zeros = if dtype == DType::F64 {
        exact_zero_gradients(&session, finding).ok().flatten()
    } else {
        None
    };
    let seen = match session.step(finding.step).and_then(|f| match f {
        Some(f) => Ok(Some(f)),
        None => session.finish(),
    }) {
        Ok(seen) => seen,
        Err(e) => return not_run(e),
    };
    // An explosion is a jump at its step (its never-recovered half is judged
    // over the whole run, not one step).
    let jump = session
        .jump()
        .filter(|j| finding.kind == FindingKind::Explosion && j.step == finding.step);
    let note = match (&seen, jump) {
        (Some(f), _) => format!(
            "{} in {} at `{}`",
            f.kind.as_str(),
            f.phase.as_str(),
            f.stage
        ),
        (None, Some(j)) => j.describe(),
        (None, None) => "the step is healthy".into(),
    };
    Ok((
        Rerun {
            precision: name,
            ran: true,
            reproduced: seen.is_some() || jump.is_some(),
            note,
        },
        zeros,
    ))
}

/// The exactly-zero elements of the gradient of the parameter a NaN in
/// the update names (`param.<name>` or `optimizer.<kind>.<name>`), at the
/// session's current state and the finding's batch.
fn exact_zero_gradients(session: &Session, finding: &Finding) -> Result<Option<usize>> {
    if finding.phase != Phase::Update || finding.kind != FindingKind::Nan {
        return Ok(None);
    }
    let (names, vars) = session.vars();
    let Some(i) = names.iter().position(|n| {
        finding.stage == format!("param.{n}")
            || crate::optim::STATE_KINDS
                .iter()
                .any(|k| finding.stage == format!("optimizer.{k}.{n}"))
    }) else {
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
    let values: Vec<f64> = g.flatten_all()?.to_vec1()?;
    Ok(Some(values.iter().filter(|&&v| v == 0.0).count()))
}
