//! The checks of one training step, as plain functions over what the step
//! produced: its batch, its loss, which variables got a gradient, the
//! gradients, the loss trend, the update, the norms' jumps. Each returns
//! a typed [`Failure`] (or a warning) and nothing else.
//!
//! Two drivers call them: the runner's `Session`, which makes the batch
//! and runs the model itself, and the guard in a user's own loop. The
//! same values fail the same check with the same kind, stage and detail,
//! and [`Finding::new`](crate::finding::Finding::new) turns either
//! driver's failure into a finding, so a finding does not depend on who
//! drove the step.

pub mod explosion;
pub mod gradient;
pub(crate) mod pending;
pub(crate) mod precision;

use crate::error::Result;
use crate::finding::{Failure, FindingKind, GradientCoverage, OpKind, Phase, StageOp, Warning};
use crate::probe::{Diverged, DivergenceTracker, Judged, TensorScan, TensorStats};
use crate::spec::dtype_max;
use candle_core::{DType, Tensor};

/// What is wrong with a batch tensor's values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BadValues {
    /// NaN or ±∞ values.
    NonFinite { nan: usize, inf: usize },
    /// Finite values the compute dtype cannot hold.
    BeyondRange {
        max_abs: f64,
        limit: f64,
        dtype: DType,
    },
}

/// The data check of a batch tensor's values, computed in `dtype`.
pub fn batch_values(scan: &TensorScan, dtype: DType) -> Option<BadValues> {
    let limit = dtype_max(dtype);
    if !scan.is_finite() {
        Some(BadValues::NonFinite {
            nan: scan.nan,
            inf: scan.inf,
        })
    } else if scan.max_abs > limit {
        Some(BadValues::BeyondRange {
            max_abs: scan.max_abs,
            limit,
            dtype,
        })
    } else {
        None
    }
}

impl BadValues {
    /// Whether one value is what this check flags (to name the samples).
    pub fn flags(&self, v: f32) -> bool {
        match *self {
            BadValues::NonFinite { .. } => !v.is_finite(),
            BadValues::BeyondRange { limit, .. } => f64::from(v.abs()) > limit,
        }
    }

    /// The failure at `stage`: `what` names the tensor ("the batch
    /// inputs"), `samples` names the dataset samples behind it (or is empty).
    pub fn failure(&self, phase: Phase, stage: &str, what: &str, samples: &str) -> Failure {
        match *self {
            BadValues::NonFinite { nan, inf } => Failure::new(
                FindingKind::of_non_finite(nan > 0, false),
                phase,
                stage,
                format!("{nan} NaN and {inf} Inf values in {what}{samples}"),
            ),
            BadValues::BeyondRange {
                max_abs,
                limit,
                dtype,
            } => Failure::new(
                FindingKind::Overflow,
                phase,
                stage,
                format!(
                    "the magnitude {max_abs:.3e} of {what} exceeds the largest {dtype:?} value {limit:.3e}{samples}"
                ),
            ),
        }
    }
}

/// The first class label outside `[0, classes)`, with its row.
pub fn bad_label(labels: &[i64], classes: usize) -> Option<(usize, i64)> {
    labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l < 0 || l >= classes as i64)
        .map(|(row, &l)| (row, l))
}

/// The loss: a non-finite value is a failure of the loss phase at
/// `stage` (a traced re-run then looks for its producer upstream).
pub fn loss(
    value: f64,
    half: bool,
    stage: &str,
    detail: impl FnOnce() -> String,
) -> Option<Failure> {
    (!value.is_finite()).then(|| {
        Failure::new(
            FindingKind::of_non_finite(value.is_nan(), half),
            Phase::Loss,
            stage,
            detail(),
        )
        .with_op(Some(StageOp::declared(OpKind::Loss)))
    })
}

/// Trainable variables that got no gradient: a `no_gradient` failure,
/// staged where the recorded flow stops (else at the first frozen module).
pub fn coverage(coverage: Option<GradientCoverage>) -> Option<Failure> {
    coverage.map(|c| {
        Failure::new(
            FindingKind::NoGradient,
            Phase::Backward,
            c.stage(),
            c.summary(),
        )
        .with_coverage(c)
    })
}

/// A backward pass candle cannot run (an op without one): a `no_gradient`
/// failure naming the op and its replacement.
pub fn unsupported_backward(u: crate::backward::Unsupported) -> Failure {
    Failure::new(
        FindingKind::NoGradient,
        Phase::Backward,
        "backward",
        format!(
            "candle has no backward pass for {}: no trainable tensor receives a gradient, so nothing can train. Replace it with {}",
            u.op, u.replacement
        ),
    )
}

/// [`unsupported_backward`] placed among a traced step's `records`: the
/// first stage whose own output cannot be differentiated holds the op
/// (after the stage before it). Without records it stays at `backward`.
pub fn unsupported_backward_in(
    u: crate::backward::Unsupported,
    records: &[crate::models::Record],
) -> Failure {
    let mut f = unsupported_backward(u);
    let stuck = records.iter().position(|r| {
        r.output
            .sum_all()
            .and_then(|s| s.backward())
            .is_err_and(|e| crate::backward::unsupported(&e).is_some())
    });
    if let Some(i) = stuck {
        let after = match i {
            0 => String::new(),
            _ => format!(", after stage `{}`", records[i - 1].name),
        };
        f.detail = format!(
            "{} (the op is inside stage `{}`{after})",
            f.detail, records[i].name
        );
        f.stage = records[i].name.clone();
        f.op = records[i].stage_op();
    }
    f
}

/// The first gradient whose scan is not finite.
pub fn first_bad(scans: &[TensorScan]) -> Option<usize> {
    scans.iter().position(|s| !s.is_finite())
}

/// A tensor that failed a check: the kind its values say, the detail with
/// their counts, its statistics.
pub fn tensor_failure(
    scan: &TensorScan,
    half: bool,
    phase: Phase,
    stage: String,
    detail: &str,
    t: &Tensor,
) -> Result<Failure> {
    let kind = FindingKind::of_non_finite(scan.nan > 0, half);
    Ok(Failure::new(
        kind,
        phase,
        stage,
        format!("{detail} ({} NaN, {} Inf)", scan.nan, scan.inf),
    )
    .with_stats(TensorStats::of_tensor(t)?))
}

/// The gradient of parameter `name` is not finite (and no traced stage
/// explains it).
pub fn gradient_failure(
    name: &str,
    scan: &TensorScan,
    half: bool,
    grad: &Tensor,
) -> Result<Failure> {
    tensor_failure(
        scan,
        half,
        Phase::Backward,
        format!("grad.{name}"),
        &format!("the gradient of `{name}` is not finite"),
        grad,
    )
}

/// A tensor an update writes.
#[derive(Clone, Copy, Debug)]
pub enum Updated<'a> {
    Param(&'a str),
    /// An optimizer state tensor (`m`, `v`, `momentum`, ...) of a parameter.
    State {
        kind: &'a str,
        param: &'a str,
    },
}

/// A tensor is not finite after the update.
pub fn update_failure(
    which: Updated,
    scan: &TensorScan,
    half: bool,
    t: &Tensor,
) -> Result<Failure> {
    let (stage, what) = match which {
        Updated::Param(name) => (format!("param.{name}"), format!("parameter `{name}`")),
        Updated::State { kind, param } => (
            format!("optimizer.{kind}.{param}"),
            format!("optimizer state `{kind}.{param}`"),
        ),
    };
    tensor_failure(
        scan,
        half,
        Phase::Update,
        stage,
        &format!("{what} is not finite after the update"),
        t,
    )
}

/// The loss trend after this step's (finite) loss: a crossing of the
/// divergence line judged diverged is a failure. The tracker advances
/// either way.
pub fn trend(tracker: &mut DivergenceTracker, value: f64) -> Option<Failure> {
    let judged = tracker.push(value)?;
    Some(divergence(tracker.factor(), &judged))
}

/// At a run's end: its crossing of the divergence line that had not
/// recovered, as a failure.
pub fn trend_at_end(tracker: &DivergenceTracker) -> Option<Failure> {
    Some(divergence(tracker.factor(), &tracker.at_end()?))
}

/// The failure of a crossing replayed alone (its step, not the steps that
/// judge it): what a replay or a precision re-run of the step sees.
pub fn crossing(tracker: &DivergenceTracker) -> Option<Failure> {
    tracker.crossed_now().then(|| {
        Failure::new(
            FindingKind::Divergence,
            Phase::Update,
            "loss_trend",
            format!(
                "the smoothed loss crossed {} x its best{}",
                tracker.factor(),
                CROSSING_ALONE
            ),
        )
    })
}

/// At a run's end, with a jump and a crossing both kept: whether the
/// crossing is judged first (it came earlier; at the same step the jump,
/// which names a tensor).
pub fn crossing_first(jumped: Option<usize>, crossed: Option<usize>) -> bool {
    matches!((jumped, crossed), (Some(j), Some(c)) if c < j)
}

/// The end of a replayed crossing's detail.
const CROSSING_ALONE: &str = " (the crossing alone: recovery is judged over the steps after it)";

fn divergence(factor: f64, d: &Diverged) -> Failure {
    let (smoothed, best, after) = (d.smoothed, d.best, d.steps_after);
    let detail = match d.judged {
        Judged::FarAbove if after == 0 => format!(
            "smoothed loss {smoothed:.4e} exceeds {} x the best {best:.4e}",
            factor * factor
        ),
        Judged::FarAbove => format!(
            "smoothed loss {smoothed:.4e} exceeds {} x the best {best:.4e}, {after} steps after it crossed {factor} x",
            factor * factor
        ),
        Judged::NotRecovered => format!(
            "smoothed loss crossed {factor} x the best {best:.4e} and had not recovered {after} steps later (smoothed {smoothed:.4e})"
        ),
        Judged::RunEnded => format!(
            "smoothed loss crossed {factor} x the best {best:.4e} and had not recovered when the run ended, {after} steps later (smoothed {smoothed:.4e})"
        ),
    };
    Failure::new(FindingKind::Divergence, Phase::Update, "loss_trend", detail)
}

/// A half-precision gradient within this factor of its dtype's largest
/// value is warned about: one more doubling of the loss scale or of the
/// loss overflows it.
pub const HALF_MARGIN: f64 = 8.0;

/// The warning for a half-precision gradient that came within
/// [`HALF_MARGIN`] of overflowing, if it did.
pub fn half_margin(step: usize, name: &str, dtype: DType, scan: &TensorScan) -> Option<Warning> {
    let limit = dtype_max(dtype);
    (matches!(dtype, DType::F16 | DType::BF16) && scan.max_abs > limit / HALF_MARGIN).then(|| {
        Warning::HalfMargin {
            step,
            tensor: name.to_string(),
            dtype: format!("{dtype:?}"),
            max_abs: scan.max_abs,
            limit,
            margin: HALF_MARGIN,
        }
    })
}

/// Adds the half-margin warning of each gradient of a healthy step (its
/// variables' `names` and `dtypes`: a gradient has its variable's dtype),
/// once per variable over a run: the first time says how close it came.
pub fn warn_half_margins(
    step: usize,
    (names, dtypes): (&[String], &[DType]),
    scans: &[TensorScan],
    warnings: &mut Vec<Warning>,
) {
    for ((name, &dtype), scan) in names.iter().zip(dtypes).zip(scans) {
        // Nothing to search for without a warning.
        let Some(w) = half_margin(step, name, dtype, scan) else {
            continue;
        };
        let seen = warnings
            .iter()
            .any(|o| matches!(o, Warning::HalfMargin { tensor, .. } if tensor == name));
        if !seen {
            warnings.push(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(values: &[f32]) -> TensorScan {
        crate::probe::scan_host(values)
    }

    #[test]
    fn a_batch_fails_on_non_finite_values_and_on_values_its_dtype_cannot_hold() {
        assert_eq!(batch_values(&scan(&[1.0, 2.0]), DType::F32), None);
        let bad = batch_values(&scan(&[1.0, f32::NAN]), DType::F32).unwrap();
        let f = bad.failure(Phase::Data, "input", "the batch inputs", "");
        assert_eq!(f.kind, FindingKind::Nan);
        assert_eq!(f.detail, "1 NaN and 0 Inf values in the batch inputs");
        let bad = batch_values(&scan(&[1.0, 7e4]), DType::F16).unwrap();
        assert!(bad.flags(7e4) && !bad.flags(1.0));
        let f = bad.failure(Phase::Data, "input", "the batch inputs", "");
        assert_eq!(f.kind, FindingKind::Overflow, "{}", f.detail);
    }

    #[test]
    fn an_infinite_loss_is_an_overflow_in_half_precision_and_an_inf_otherwise() {
        let detail = || "the loss is inf".to_string();
        assert_eq!(loss(1.0, true, "loss", detail), None);
        let f32_loss = loss(f64::INFINITY, false, "loss", detail).unwrap();
        let f16_loss = loss(f64::INFINITY, true, "loss", detail).unwrap();
        assert_eq!(
            (f32_loss.kind, f16_loss.kind),
            (FindingKind::Inf, FindingKind::Overflow)
        );
        assert_eq!(
            loss(f64::NAN, true, "loss", detail).unwrap().kind,
            FindingKind::Nan
        );
    }

    #[test]
    fn a_half_precision_gradient_near_its_range_is_warned_about() {
        assert!(half_margin(3, "w", DType::F16, &scan(&[5000.0])).is_none());
        let w = half_margin(3, "w", DType::F16, &scan(&[20000.0]))
            .unwrap()
            .to_string();
        assert!(
            w.starts_with("step 3:") && w.contains("`w`") && w.contains("F16"),
            "{w}"
        );
        assert!(half_margin(3, "w", DType::F32, &scan(&[1e38])).is_none());
    }

    #[test]
    fn a_variable_is_warned_of_once_a_run_and_only_in_half_precision() {
        let names = ["a".to_string(), "b".to_string()];
        let near = [scan(&[20000.0]), scan(&[30000.0])];
        let mut warnings = Vec::new();
        warn_half_margins(1, (&names, &[DType::F16, DType::F32]), &near, &mut warnings);
        warn_half_margins(2, (&names, &[DType::F16, DType::F16]), &near, &mut warnings);
        let got: Vec<(usize, &str)> = warnings.iter().map(|w| (w.step(), w.tensor())).collect();
        assert_eq!(got, [(1, "a"), (2, "b")]);
    }
}
