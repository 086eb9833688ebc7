//! The trigger search: from a trained state, inputs within k× the data's
//! scale of a training batch (an L∞ ball) that drive a risky stage across
//! its unsafe domain, following the gradient of its pressure with respect
//! to the input (projected sign steps), from the batch itself and from the
//! batch scaled to the ball's edge, plus the batch with its smallest row
//! zeroed for the ops whose unsafe point is a 0. A candidate that reaches
//! the domain is confirmed by the step engine itself (the step run from the
//! trained state on that batch), so a trigger is an ordinary finding; and
//! weight drift: a few steps at a higher learning rate from the same state.

use crate::data::{HostBatch, HostInput, Saved};
use crate::error::Result;
use crate::finding::{Finding, Trace};
use crate::models::{ModelFactory, Record, Tracer};
use crate::runner::{RunOptions, Session, Snapshot};
use crate::spec::{Case, ScheduleSpec};
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;
use std::time::{Duration, Instant};

/// A stage (or an op) to hunt, and the rule of its kind.
#[derive(Clone)]
pub(super) struct Target {
    pub stage: String,
    pub rule: &'static dyn crate::rules::OpRule,
}

/// Where a search starts and how it confirms what it found: the state a
/// step starts from, the batch around which it searches, and the case that
/// replays a trigger (the batch as the model sees it: no pathologies or
/// augmentations applied again).
pub(super) struct Ground<'a> {
    pub case: Case,
    /// The case the hunt searches (`case` is its replay of one step).
    pub origin: Case,
    pub factory: &'a dyn ModelFactory,
    pub opts: RunOptions,
    pub snapshot: Snapshot,
    pub history: Trace,
    pub step: usize,
    pub batch: HostBatch,
}

impl Ground<'_> {
    /// The step from the ground's state on `batch`: its finding, if it
    /// fails; with `dir`, the finding's scene written there.
    pub fn fire(&self, batch: &HostBatch, dir: Option<&Path>) -> Result<Option<Finding>> {
        let mut case = self.case.clone();
        case.batch_size = batch.input.dims().first().copied().unwrap_or(1).max(1);
        let source = Saved {
            step: self.step,
            batch: batch.clone(),
        };
        let mut session = Session::with_source(&case, self.factory, &self.opts, Box::new(source))?;
        session.set_history(self.history.clone());
        session.restore(&self.snapshot)?;
        let found = session.step(self.step)?;
        if let (Some(f), Some(dir)) = (&found, dir) {
            // An earlier hunt's reproducer of the same signature is replaced
            // only by a complete new one.
            crate::files::replace_dir_atomic(dir, |tmp| {
                session.write_dump_from(tmp, f, &self.origin)
            })?;
        }
        Ok(found)
    }
}

/// The batch with its real inputs replaced by `values`.
fn with_values(batch: &HostBatch, values: Vec<f32>) -> HostBatch {
    let mut b = batch.clone();
    if let HostInput::Real { dims, .. } = &batch.input {
        b.input = HostInput::Real {
            values,
            dims: dims.clone(),
        };
    }
    b
}

/// A trigger: the batch that fires, the rows of the ground's batch it
/// keeps, its distance from the ground's batch in multiples of the data's
/// scale (real inputs), and the finding the step engine gave.
pub(super) struct Found {
    pub batch: HostBatch,
    pub rows: Vec<usize>,
    pub perturbation: f64,
    pub finding: Finding,
}

impl Found {
    /// A trigger of the whole of `batch`.
    pub fn whole(batch: HostBatch, perturbation: f64, finding: Finding) -> Found {
        let n = batch.input.dims().first().copied().unwrap_or(1);
        Found {
            batch,
            rows: (0..n).collect(),
            perturbation,
            finding,
        }
    }
}

/// Evaluates candidates against the ground's state (the main session,
/// restored to it) and counts the evaluations.
pub(super) struct Search<'a> {
    pub session: &'a Session<'a>,
    pub ground: &'a Ground<'a>,
    pub evaluations: usize,
    pub pgd_steps: usize,
    /// When the current stage's search must stop.
    pub deadline: Option<Instant>,
    /// Whether the current stage's search stopped at the deadline.
    pub cut: bool,
}

impl Search<'_> {
    /// Starts a stage's search: it stops at `end` (the hunt's) or after
    /// `per_stage`, whichever comes first.
    pub fn time_box(&mut self, end: Option<Instant>, per_stage: Option<Duration>) {
        let own = per_stage.map(|d| Instant::now() + d);
        self.deadline = match (end, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.cut = false;
    }

    /// Whether the search must stop now (and remembers that it did).
    pub fn out_of_time(&mut self) -> bool {
        let over = self.deadline.is_some_and(|d| Instant::now() >= d);
        self.cut |= over;
        over
    }

    /// The first input within the bounds (multiples of the data's scale)
    /// whose step the engine confirms fails; `None` when none does, or
    /// when the inputs are not real-valued.
    pub fn input(&mut self, target: &Target, bounds: &[f64]) -> Result<Option<Found>> {
        let HostInput::Real { values, .. } = &self.ground.batch.input else {
            return Ok(None);
        };
        let x0 = values.clone();
        let scale = data_scale(&x0);
        for &k in bounds {
            let radius = k * scale;
            let mut starts = vec![scaled(&x0, 1.0 + k), scaled(&x0, 1.0 - k)];
            if target.rule.at_zero() {
                starts.extend(zero_row(&self.ground.batch, radius));
            }
            for start in starts {
                if let Some(found) = self.climb(target, &x0, start, radius, scale)? {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// Projected sign-gradient ascent of the target's pressure from
    /// `start`, inside the ball of `radius` around `x0`.
    fn climb(
        &mut self,
        target: &Target,
        x0: &[f32],
        mut x: Vec<f32>,
        radius: f64,
        scale: f64,
    ) -> Result<Option<Found>> {
        let alpha = (radius / 4.0) as f32;
        for _ in 0..=self.pgd_steps {
            if self.out_of_time() {
                return Ok(None);
            }
            let (reached, grad) = self.evaluate(target, &x)?;
            if reached {
                if let Some(found) = self.confirm(&x, x0, scale)? {
                    return Ok(Some(found));
                }
            }
            let Some(grad) = grad else {
                return Ok(None);
            };
            for ((xi, g), x0i) in x.iter_mut().zip(&grad).zip(x0) {
                let step = if g.is_finite() {
                    alpha * g.signum()
                } else {
                    0.0
                };
                let (lo, hi) = (x0i - radius as f32, x0i + radius as f32);
                *xi = (*xi + step).clamp(lo, hi);
            }
        }
        Ok(None)
    }

    /// The step engine's verdict on the candidate `x`.
    fn confirm(&mut self, x: &[f32], x0: &[f32], scale: f64) -> Result<Option<Found>> {
        let batch = with_values(&self.ground.batch, x.to_vec());
        let Some(finding) = self.ground.fire(&batch, None)? else {
            return Ok(None);
        };
        if !finding.kind.is_non_finite() {
            return Ok(None);
        }
        let distance = x
            .iter()
            .zip(x0)
            .fold(0f64, |m, (a, b)| m.max(f64::from((a - b).abs())));
        Ok(Some(Found::whole(batch, distance / scale, finding)))
    }

    /// A traced forward pass on `x`: whether some stage reached a non-finite
    /// value or the target its unsafe domain, and the gradient of the
    /// target's pressure with respect to the input.
    fn evaluate(&mut self, target: &Target, x: &[f32]) -> Result<(bool, Option<Vec<f32>>)> {
        let dims = self.ground.batch.input.dims().to_vec();
        let input = Tensor::from_slice(x, dims.as_slice(), &Device::Cpu)?
            .to_dtype(self.session.compute_dtype())?;
        let var = Var::from_tensor(&input)?;
        let pass = self.pass(target, var.as_tensor())?;
        let grad = match pass.grads.as_ref().and_then(|g| g.get(var.as_tensor())) {
            Some(g) => Some(g.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?),
            None => None,
        };
        Ok((pass.reached, grad))
    }

    /// A traced forward pass of the model on `input` (the ground batch
    /// gives the targets) and the backward pass of the target's pressure.
    pub(super) fn pass(&mut self, target: &Target, input: &Tensor) -> Result<Pass> {
        self.evaluations += 1;
        let mut tracer = Tracer::on();
        let shared = crate::models::tracer::share(&tracer);
        let forward =
            self.session
                .forward_with_input(&self.ground.batch, input.clone(), &mut tracer);
        drop(shared);
        let forward = forward?;
        let records = tracer.records().clone();
        let loss = forward.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let non_finite = !loss.is_finite() || crate::localize::first_forward(&records)?.is_some();
        let Some(i) = records.iter().position(|r| r.name == target.stage) else {
            return Ok(Pass {
                reached: non_finite,
                grads: None,
                records,
            });
        };
        let (reached, grads) = {
            let g = crate::models::graph::OpGraph::new(&records);
            let view = crate::rules::View::of(&g, i, input);
            let reached = non_finite || target.rule.margin(&view)?.is_some_and(|m| m <= 0.0);
            let grads = match target.rule.pressure(&view)? {
                Some(pressure) => Some(pressure.backward()?),
                None => None,
            };
            (reached, grads)
        };
        Ok(Pass {
            reached,
            grads,
            records,
        })
    }
}

/// What one traced pass saw: whether something reached its unsafe domain,
/// the stages it recorded and the gradients of the target's pressure.
pub(super) struct Pass {
    pub reached: bool,
    pub grads: Option<candle_core::backprop::GradStore>,
    pub records: Vec<Record>,
}

/// The largest magnitude of the batch: the unit of a perturbation.
pub(super) fn data_scale(values: &[f32]) -> f64 {
    let m = values
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(f64::from(v.abs())));
    if m > 0.0 {
        m
    } else {
        1.0
    }
}

fn scaled(x: &[f32], by: f64) -> Vec<f32> {
    x.iter().map(|v| (f64::from(*v) * by) as f32).collect()
}

/// The batch with its row of the smallest norm set to 0, when that row
/// lies within `radius` of 0.
fn zero_row(batch: &HostBatch, radius: f64) -> Option<Vec<f32>> {
    let HostInput::Real { values, dims } = &batch.input else {
        return None;
    };
    let per = values.len() / dims.first().copied().unwrap_or(1).max(1);
    let norm = |r: &[f32]| r.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>();
    let (i, row) = values
        .chunks(per.max(1))
        .enumerate()
        .min_by(|a, b| norm(a.1).total_cmp(&norm(b.1)))?;
    let largest = row.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    if largest > radius {
        return None;
    }
    let mut out = values.clone();
    out[i * per..(i + 1) * per].fill(0.0);
    Some(out)
}

/// `batch` with only the samples `keep`.
pub(super) fn subset(batch: &HostBatch, keep: &[usize]) -> HostBatch {
    let rows = batch.input.dims().first().copied().unwrap_or(1).max(1);
    let pick = |len: usize| -> Vec<std::ops::Range<usize>> {
        let per = len / rows;
        keep.iter().map(|&r| r * per..(r + 1) * per).collect()
    };
    let take_f32 = |v: &[f32]| {
        pick(v.len())
            .into_iter()
            .flat_map(|r| v[r].to_vec())
            .collect()
    };
    let mut out = batch.clone();
    out.input = match &batch.input {
        HostInput::Real { values, dims } => {
            let mut dims = dims.clone();
            dims[0] = keep.len();
            HostInput::Real {
                values: take_f32(values),
                dims,
            }
        }
        HostInput::Tokens { ids, dims } => {
            let mut dims = dims.clone();
            dims[0] = keep.len();
            let ids = pick(ids.len())
                .into_iter()
                .flat_map(|r| ids[r].to_vec())
                .collect();
            HostInput::Tokens { ids, dims }
        }
    };
    out.labels = pick(batch.labels.len())
        .into_iter()
        .flat_map(|r| batch.labels[r].to_vec())
        .collect();
    out.targets = take_f32(&batch.targets);
    out.samples = keep
        .iter()
        .filter_map(|&r| batch.samples.get(r).copied())
        .collect();
    out.mix = None;
    out
}

/// The smallest set of rows (halving, as delta debugging) whose step still
/// fails with the found signature; a candidate the model refuses is no
/// smaller trigger.
pub(super) fn minimize_rows(ground: &Ground, found: &mut Found) -> Result<()> {
    loop {
        let n = found.batch.input.dims().first().copied().unwrap_or(1);
        if n <= 1 {
            return Ok(());
        }
        let mut kept = None;
        for part in [(0..n / 2).collect::<Vec<_>>(), (n / 2..n).collect()] {
            let candidate = subset(&found.batch, &part);
            // The shrink is an optimization: a model that cannot take fewer
            // rows (it groups them, or its graph has a fixed size) keeps
            // the trigger as it was.
            let same = ground
                .fire(&candidate, None)
                .is_ok_and(|f| f.is_some_and(|f| f.signature == found.finding.signature));
            if same {
                kept = Some((candidate, part));
                break;
            }
        }
        match kept {
            Some((b, part)) => {
                found.rows = part.iter().map(|&i| found.rows[i]).collect();
                found.batch = b;
            }
            None => return Ok(()),
        }
    }
}

/// Weight drift: `steps` steps at `factor` × the learning rate (constant)
/// from the ground's state on the case's own data; the finding of the
/// first step that fails, with its scene written to `dir`.
pub(super) fn drift(
    base: &Case,
    ground: &Ground,
    factor: f64,
    steps: usize,
    dir: &Path,
) -> Result<Option<Finding>> {
    let mut case = base.clone();
    case.optimizer.set_lr(case.optimizer.lr() * factor);
    case.schedule = ScheduleSpec::Constant;
    case.steps = ground.step + steps;
    let mut session = match Session::new(&case, ground.factory, &ground.opts) {
        Ok(s) => s,
        Err(crate::Error::InvalidCase { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    session.set_history(ground.history.clone());
    session.restore(&ground.snapshot)?;
    for step in ground.step..case.steps {
        if let Some(f) = session.step(step)? {
            // `dir` is the hunt's own scratch.
            let _ = std::fs::remove_dir_all(dir);
            session.write_dump(dir, &f)?;
            return Ok(Some(f));
        }
    }
    Ok(None)
}

/// Whether an outcome's finding names `stage` (at it, or explained there).
pub(super) fn names(f: &Finding, stage: &str) -> bool {
    f.stage == stage || f.explanation.as_ref().is_some_and(|e| e.stage == stage)
}
