//! nanhunt in the user's own training loop: a guard checks each step of
//! any candle loop (the batch, the loss, that every trainable variable got
//! a gradient, every gradient, the parameters after the update, the loss
//! trend), keeps what it needs to undo the step (nanhunt's optimizers are
//! checked before they set anything), and on the first failure
//! restores the state from before it, re-runs the step with tracing on to
//! name the first producer, writes the scene and stops the loop with a
//! typed error carrying the [`Finding`].
//!
//! ```ignore
//! let mut guard = Guard::new(&varmap, GuardOptions::default().dump_to("nan-scene"))?;
//! let mut opt = guard.optimizer(OptimizerSpec::Adamw {
//!     lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01,
//! })?;
//! for step in 0..steps {
//!     let batch = Batch::new([("x", x.clone()), ("y", y.clone())]);
//!     guard.step(step, &batch, &mut opt, |b| loss_of(&model, b.get("x")?, b.get("y")?))?;
//! }
//! ```

mod optim;
mod replay;
mod scene;

pub use optim::{GuardOptimizer, NanhuntOptimizer, OptimizerRecord, SavedOptimizer};
pub use replay::{replay, GuardReplay};
pub use scene::{GuardScene, SCENE_FILE, SCENE_TENSORS};

use crate::coverage::GradientCoverage;
use crate::error::Error;
use crate::localize;
use crate::outcome::{Finding, FindingKind, Phase, Signature, Trace};
use crate::probe::{scan_all, DivergenceTracker, TensorScan, TensorStats};
use crate::spec::{dtype_max, OptimizerSpec};
use candle_core::{DType, Result as CandleResult, Tensor, Var};
use std::path::PathBuf;

/// How a guard checks and where it writes the scene.
#[derive(Clone, Debug)]
pub struct GuardOptions {
    /// The name signatures give the model (`family`).
    pub name: String,
    /// Write the scene of the first failure here (it must not exist yet).
    pub dump: Option<PathBuf>,
    /// Divergence: the smoothed loss exceeds this many times its best.
    pub divergence_factor: f64,
    /// Only tensors whose dump name starts with one of these go into the
    /// scene (`param/encoder.`, `batch/`); empty: all. Bounds its size.
    pub include: Vec<String>,
    /// Variables (or module prefixes: `encoder` covers `encoder.l1.weight`)
    /// that are deliberately not trained: they need no gradient, and the
    /// guard's optimizer leaves them alone.
    pub frozen: Vec<String>,
}

impl Default for GuardOptions {
    fn default() -> Self {
        GuardOptions {
            name: "user".into(),
            dump: None,
            divergence_factor: 4.0,
            include: Vec::new(),
            frozen: Vec::new(),
        }
    }
}

impl GuardOptions {
    pub fn dump_to(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dump = Some(dir.into());
        self
    }

    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Declares variables (or module prefixes) frozen.
    pub fn frozen<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.frozen.extend(names.into_iter().map(Into::into));
        self
    }
}

/// A step's batch: named tensors, in order.
#[derive(Clone, Debug)]
pub struct Batch {
    parts: Vec<(String, Tensor)>,
}

impl Batch {
    pub fn new<S: Into<String>>(parts: impl IntoIterator<Item = (S, Tensor)>) -> Self {
        Batch {
            parts: parts.into_iter().map(|(n, t)| (n.into(), t)).collect(),
        }
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> CandleResult<&Tensor> {
        self.parts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| candle_core::Error::Msg(format!("the batch has no tensor `{name}`")))
    }

    pub fn parts(&self) -> &[(String, Tensor)] {
        &self.parts
    }
}

/// Why a guarded step stopped the loop.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The step failed: the finding names the first producer; the state
    /// from before the step is back in place and the scene is written.
    #[error("{}: {} (step {}){}", .finding.signature, .finding.detail, .finding.step,
            .dump.as_ref().map(|d| format!("; scene in {}", d.display())).unwrap_or_default())]
    Unstable {
        finding: Box<Finding>,
        dump: Option<PathBuf>,
    },
    /// The guard was used wrongly (bad batch, a dump directory that exists)
    /// or candle failed.
    #[error(transparent)]
    Invalid(#[from] Error),
}

impl From<candle_core::Error> for GuardError {
    fn from(e: candle_core::Error) -> Self {
        GuardError::Invalid(Error::from(e))
    }
}

impl GuardError {
    pub fn finding(&self) -> Option<&Finding> {
        match self {
            GuardError::Unstable { finding, .. } => Some(finding),
            GuardError::Invalid(_) => None,
        }
    }
}

/// The state a step changes, kept to undo it.
struct Before {
    /// A copy of the parameters, when the optimizer sets them before they
    /// can be checked; `None`: they change only after the checks pass.
    params: Option<Vec<Tensor>>,
    buffers: Vec<Tensor>,
    optimizer: Option<SavedOptimizer>,
    tracker: DivergenceTracker,
    history: Trace,
}

/// A failure before it becomes a finding.
struct Failure {
    kind: FindingKind,
    phase: Phase,
    stage: String,
    detail: String,
    stats: Option<TensorStats>,
    coverage: Option<Box<GradientCoverage>>,
    explanation: Option<Box<crate::explain::Explanation>>,
}

/// The failure of a backward pass that left variables without a gradient,
/// staged at the flow's stop when a traced re-run saw it.
fn no_gradient(coverage: GradientCoverage) -> Failure {
    Failure {
        kind: FindingKind::NoGradient,
        phase: Phase::Backward,
        stage: coverage.stage(),
        detail: coverage.summary(),
        stats: None,
        coverage: Some(Box::new(coverage)),
        explanation: None,
    }
}

/// Watches the steps of a training loop.
pub struct Guard {
    names: Vec<String>,
    vars: Vec<Var>,
    opts: GuardOptions,
    tracker: DivergenceTracker,
    trace: Trace,
    /// The batch's names and per-sample dims, from the first step.
    layout: Option<Vec<(String, DType, Vec<usize>)>>,
    /// Half-precision gradients that came near their dtype's largest value
    /// (at most one per variable).
    warnings: Vec<String>,
    /// The largest gradient norm so far (the jump check's baseline).
    grad_norm_max: f64,
    /// Non-trainable state a forward pass may change (batch-norm running
    /// statistics in training mode): restored with the step.
    buffers: Vec<Var>,
}

/// A half-precision gradient within this factor of its dtype's largest
/// value is warned about: one more doubling of the loss scale or of the
/// loss overflows it.
pub const HALF_MARGIN: f64 = 8.0;

impl Guard {
    /// A guard over every variable of `varmap` (in name order). Buffers
    /// (`running_mean`, `running_var`, ...: a VarMap holds them as
    /// variables) are not trained: they are saved and restored with the
    /// step, but need no gradient.
    pub fn new(varmap: &candle_nn::VarMap, opts: GuardOptions) -> crate::Result<Self> {
        let mut named: Vec<(String, Var)> = varmap
            .data()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let (buffers, trainable): (Vec<_>, Vec<_>) = named
            .into_iter()
            .partition(|(n, _)| crate::models::is_buffer(n));
        let mut guard = Guard::with_vars(trainable, opts)?;
        guard.buffers = buffers.into_iter().map(|(_, v)| v).collect();
        Ok(guard)
    }

    /// A guard over named trainable variables, in the order given.
    pub fn with_vars(named: Vec<(String, Var)>, opts: GuardOptions) -> crate::Result<Self> {
        let named: Vec<(String, Var)> = named
            .into_iter()
            .filter(|(n, _)| !crate::coverage::declared_frozen(n, &opts.frozen))
            .collect();
        if named.is_empty() {
            return Err(Error::option(
                "vars",
                "the guard has no trainable variables to watch (was the model built on this VarMap? are they all declared frozen?)",
            ));
        }
        if let Some(dir) = &opts.dump {
            crate::dump::ensure_free(dir)?;
        }
        if !(opts.divergence_factor > 1.0 && opts.divergence_factor.is_finite()) {
            return Err(Error::option(
                "divergence_factor",
                format!("must be finite and above 1, got {}", opts.divergence_factor),
            ));
        }
        let (names, vars) = named.into_iter().unzip();
        Ok(Guard {
            names,
            vars,
            tracker: DivergenceTracker::new(opts.divergence_factor),
            opts,
            trace: Trace::default(),
            layout: None,
            warnings: Vec::new(),
            grad_norm_max: 0.0,
            buffers: Vec::new(),
        })
    }

    /// The variables in the guard's order.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// nanhunt's optimizer of `spec` over the guard's variables.
    pub fn optimizer(&self, spec: OptimizerSpec) -> crate::Result<NanhuntOptimizer> {
        Ok(<NanhuntOptimizer as candle_nn::Optimizer>::new(
            self.vars.clone(),
            spec,
        )?)
    }

    /// The losses and gradient norms of the steps so far.
    pub fn history(&self) -> &Trace {
        &self.trace
    }

    /// Half-precision gradients that came within [`HALF_MARGIN`] of
    /// overflowing (the run goes on; these say how close it came).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// One guarded step: `loss_of` computes the loss of `batch` with the
    /// current parameters (it may be called again, with tracing on, to
    /// localize a failure); the guard runs backward and the optimizer.
    /// Returns the loss.
    pub fn step<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        batch: &Batch,
        opt: &mut O,
        mut loss_of: impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> std::result::Result<f64, GuardError> {
        self.check_layout(batch)?;
        let before = Before {
            params: if opt.can_prepare() {
                None
            } else {
                Some(
                    self.vars
                        .iter()
                        .map(|v| v.as_tensor().copy())
                        .collect::<CandleResult<_>>()?,
                )
            },
            buffers: self
                .buffers
                .iter()
                .map(|v| v.as_tensor().copy())
                .collect::<CandleResult<_>>()?,
            optimizer: opt.saved(),
            tracker: self.tracker.clone(),
            history: self.trace.clone(),
        };
        if let Some(f) = self.check_batch(batch)? {
            return Err(self.stop(step, f, &before, opt, batch, &mut loss_of));
        }
        let loss = loss_of(batch)?;
        let value = scalar(&loss)?;
        self.trace.losses.push(value);
        if !value.is_finite() {
            let f = Failure {
                kind: if value.is_nan() {
                    FindingKind::Nan
                } else {
                    FindingKind::Inf
                },
                phase: Phase::Loss,
                stage: "loss".into(),
                detail: format!("the loss is {value}"),
                stats: None,
                coverage: None,
                explanation: None,
            };
            return Err(self.stop(step, f, &before, opt, batch, &mut loss_of));
        }
        let grads = loss.backward()?;
        if let Some(coverage) = crate::coverage::of(&self.names, &self.vars, &grads, &[]) {
            let f = no_gradient(coverage);
            return Err(self.stop(step, f, &before, opt, batch, &mut loss_of));
        }
        let g: Vec<&Tensor> = self
            .vars
            .iter()
            .map(|v| grads.get(v.as_tensor()).expect("checked above"))
            .collect();
        let scans = scan_all(&g)?;
        if let Some(i) = scans.iter().position(|s| !s.is_finite()) {
            let f = failure_of(
                &scans[i],
                Phase::Backward,
                format!("grad.{}", self.names[i]),
                format!("the gradient of `{}` is not finite", self.names[i]),
                g[i],
            )?;
            return Err(self.stop(step, f, &before, opt, batch, &mut loss_of));
        }
        for ((t, scan), name) in g.iter().zip(&scans).zip(&self.names) {
            let dtype = t.dtype();
            let limit = dtype_max(dtype);
            if matches!(dtype, DType::F16 | DType::BF16)
                && scan.max_abs > limit / HALF_MARGIN
                && !self
                    .warnings
                    .iter()
                    .any(|w| w.contains(&format!("`{name}`")))
            {
                self.warnings.push(format!(
                    "step {step}: the gradient of `{name}` reached {:.4e}, within {HALF_MARGIN}x of the largest {dtype:?} value {limit:.4e}",
                    scan.max_abs
                ));
            }
        }
        let sum_sq: Vec<f64> = scans.iter().map(|s| s.sum_sq).collect();
        let norm = crate::optim::global_norm(&sum_sq);
        self.warn_of_a_jump(step, norm);
        self.trace.grad_norms.push(norm);
        // The loss trend first: a diverged run takes no update.
        if let Some(smoothed) = self.tracker.push(value) {
            let f = Failure {
                kind: FindingKind::Divergence,
                phase: Phase::Update,
                stage: "loss_trend".into(),
                detail: format!(
                    "smoothed loss {smoothed:.4e} exceeds {} x the best {:.4e}",
                    self.opts.divergence_factor,
                    self.tracker.best()
                ),
                stats: None,
                coverage: None,
                explanation: None,
            };
            return Err(self.stop(step, f, &before, opt, batch, &mut loss_of));
        }
        // The update, checked before it is set where the optimizer can say
        // what it would be (nanhunt's), else after.
        let prepared = opt.prepare(&grads)?;
        let updated: Vec<Tensor> = match &prepared {
            Some(new) => new.clone(),
            None => {
                opt.apply(&grads)?;
                self.vars.iter().map(|v| v.as_tensor().clone()).collect()
            }
        };
        let refs: Vec<&Tensor> = updated.iter().collect();
        if let Some(i) = crate::probe::first_non_finite(&refs)? {
            let scan = scan_all(&[refs[i]])?[0];
            let f = failure_of(
                &scan,
                Phase::Update,
                format!("param.{}", self.names[i]),
                format!(
                    "parameter `{}` is not finite after the update ({} NaN, {} Inf)",
                    self.names[i], scan.nan, scan.inf
                ),
                refs[i],
            )?;
            return Err(self.stop(step, f, &before, opt, batch, &mut loss_of));
        }
        if let Some(new) = prepared {
            opt.commit(new)?;
        }
        Ok(value)
    }

    /// The batch keeps its names, dtypes and per-sample dims from step to step.
    fn check_layout(&mut self, batch: &Batch) -> std::result::Result<(), GuardError> {
        let layout: Vec<(String, DType, Vec<usize>)> = batch
            .parts
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    t.dtype(),
                    t.dims().iter().skip(1).copied().collect(),
                )
            })
            .collect();
        let Some(first) = &self.layout else {
            self.layout = Some(layout);
            return Ok(());
        };
        if *first == layout {
            return Ok(());
        }
        let describe = |l: &[(String, DType, Vec<usize>)]| {
            l.iter()
                .map(|(n, d, s)| format!("`{n}` {d:?} (N, {s:?})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Err(GuardError::Invalid(Error::option(
            "batch",
            format!(
                "this step's batch is {}, the first step's was {}: tensors must keep their names, dtypes and per-sample shapes",
                describe(&layout),
                describe(first)
            ),
        )))
    }

    /// The article's data check on the batch's float tensors: non-finite
    /// values, and magnitudes beyond the dtype's range.
    fn check_batch(&self, batch: &Batch) -> crate::Result<Option<Failure>> {
        for (name, t) in &batch.parts {
            if !t.dtype().is_float() {
                continue;
            }
            let scan = scan_all(&[t])?[0];
            let limit = dtype_max(t.dtype());
            if scan.is_finite() && scan.max_abs <= limit {
                continue;
            }
            let detail = if scan.is_finite() {
                format!(
                    "batch tensor `{name}` exceeds the largest {:?} value",
                    t.dtype()
                )
            } else {
                format!(
                    "batch tensor `{name}` holds {} NaN and {} Inf values",
                    scan.nan, scan.inf
                )
            };
            return Ok(Some(failure_of(
                &scan,
                Phase::Data,
                format!("batch.{name}"),
                detail,
                t,
            )?));
        }
        Ok(None)
    }

    /// Ends a failed step: restores the state from before it, localizes,
    /// writes the scene, and makes the error.
    fn stop<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        first: Failure,
        before: &Before,
        opt: &mut O,
        batch: &Batch,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> GuardError {
        let losses = self.trace.losses.clone();
        if let Err(e) = self.restore(before, opt) {
            return e.into();
        }
        let failure = match first.phase {
            Phase::Backward if first.kind == FindingKind::NoGradient => {
                match self.localize_cut(batch, loss_of) {
                    Ok(Some(f)) => f,
                    Ok(None) => first,
                    Err(e) => return e.into(),
                }
            }
            Phase::Loss | Phase::Backward => match self.localize(batch, loss_of) {
                Ok(Some(f)) => f,
                Ok(None) => first,
                Err(e) => return e.into(),
            },
            _ => first,
        };
        let mut trace = before.history.clone();
        trace.losses = losses;
        trace.grad_norms = self.trace.grad_norms.clone();
        let precision = match self.vars[0].dtype() {
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            _ => "f32",
        };
        let device = match self.vars[0].device().location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
            _ => "cpu".to_string(),
        };
        let finding = Finding {
            step,
            kind: failure.kind,
            phase: failure.phase,
            signature: Signature {
                kind: failure.kind,
                phase: failure.phase,
                stage: crate::outcome::user_stage_key(&failure.stage),
                family: self.opts.name.clone(),
                optimizer: opt.name(),
                precision: precision.into(),
                device,
            },
            op: localize::op_of(&failure.stage),
            stage: failure.stage,
            detail: failure.detail,
            stats: failure.stats,
            coverage: failure.coverage,
            precision: None,
            explanation: failure.explanation,
            trace,
        };
        let dump = self.opts.dump.clone();
        if let Some(dir) = &dump {
            // Restored above: the variables hold the state from before the step.
            let params: Vec<Tensor> = self.vars.iter().map(|v| v.as_tensor().clone()).collect();
            let saved = scene::Scene {
                names: &self.names,
                before_params: &params,
                optimizer: before.optimizer.as_ref(),
                optimizer_name: opt.name(),
                optimizer_vars: opt_var_names(opt, &self.vars, &self.names),
                tracker: &before.tracker,
                history: &before.history,
                batch,
                finding: &finding,
                include: &self.opts.include,
                warnings: &self.warnings,
            };
            if let Err(e) = scene::write(dir, &saved) {
                return e.into();
            }
        }
        GuardError::Unstable {
            finding: Box::new(finding),
            dump,
        }
    }

    /// Puts the parameters, optimizer, tracker and history back as they
    /// were before the step.
    fn restore<O: GuardOptimizer + ?Sized>(
        &mut self,
        before: &Before,
        opt: &mut O,
    ) -> crate::Result<()> {
        if let Some(params) = &before.params {
            for (v, t) in self.vars.iter().zip(params) {
                v.set(t)?;
            }
        }
        for (v, t) in self.buffers.iter().zip(&before.buffers) {
            v.set(t)?;
        }
        if let Some(saved) = &before.optimizer {
            opt.restore(saved)?;
        }
        self.tracker = before.tracker.clone();
        self.trace = before.history.clone();
        Ok(())
    }

    /// Re-runs the step's forward and backward with tracing on (nothing is
    /// updated) and names the first producer among the traced stages.
    /// Re-runs the loss with tracing on: the stages `nanhunt::trace` records
    /// say where the gradient flow stops.
    fn localize_cut(
        &self,
        batch: &Batch,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> crate::Result<Option<Failure>> {
        let (loss, tracer) = crate::trace::traced(|| loss_of(batch));
        let grads = loss?.backward()?;
        let records = tracer.records();
        Ok(crate::coverage::of(&self.names, &self.vars, &grads, &records).map(no_gradient))
    }

    fn localize(
        &self,
        batch: &Batch,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> crate::Result<Option<Failure>> {
        let (loss, tracer) = crate::trace::traced(|| loss_of(batch));
        let loss = loss?;
        let records = tracer.records();
        if let Some((i, scan)) = localize::first_forward(&records)? {
            let r = &records[i];
            let mut f = failure_of(
                &scan,
                Phase::Forward,
                r.name.clone(),
                format!(
                    "stage `{}` is the first to output non-finite values ({} NaN, {} Inf) from finite inputs",
                    r.name, scan.nan, scan.inf
                ),
                &r.output,
            )?;
            f.explanation = Some(Box::new(crate::explain::forward(&records, i, None)?));
            return Ok(Some(f));
        }
        if !scalar(&loss)?.is_finite() {
            return Ok(None);
        }
        let grads = loss.backward()?;
        Ok(match localize::first_backward(&records, &grads)? {
            Some(p) => {
                let stage = p.stage.clone().unwrap_or_else(|| "loss".into());
                let mut f = failure_of(
                    &p.scan,
                    Phase::Backward,
                    stage.clone(),
                    p.detail(&stage),
                    &p.grad,
                )?;
                if let Some(s) = p.stage_index {
                    let e = crate::explain::backward(&records, s, p.receiver_index, &p.grad)?;
                    f.explanation = Some(Box::new(e));
                }
                Some(f)
            }
            None => None,
        })
    }
}

impl Guard {
    /// A gradient norm 1e3x the largest before it ([`crate::explosion`]):
    /// the loop goes on (whether the loss recovers is the loop's to see),
    /// with one warning.
    fn warn_of_a_jump(&mut self, step: usize, norm: f64) {
        let largest = self.grad_norm_max;
        self.grad_norm_max = largest.max(norm);
        let warned = self.warnings.iter().any(|w| w.contains("finite explosion"));
        if !warned && crate::explosion::is_jump(largest, norm) {
            self.warnings.push(format!(
                "step {step}: the gradient norm grew {:.2e}x in one step (from at most {largest:.3e} to {norm:.3e}): a finite explosion unless the loss recovers; clip the gradient norm or lower the learning rate",
                norm / largest
            ));
        }
    }
}

/// The optimizer's variables by guard name, where it tells them.
fn opt_var_names<O: GuardOptimizer + ?Sized>(
    opt: &O,
    vars: &[Var],
    names: &[String],
) -> Vec<String> {
    opt.vars()
        .unwrap_or_default()
        .iter()
        .map(|v| {
            vars.iter()
                .position(|g| g.as_tensor().id() == v.as_tensor().id())
                .map_or_else(|| "(not guarded)".to_string(), |i| names[i].clone())
        })
        .collect()
}

fn scalar(loss: &Tensor) -> crate::Result<f64> {
    if loss.elem_count() != 1 {
        return Err(Error::option(
            "loss",
            format!(
                "the step closure must return the scalar loss, got shape {:?}",
                loss.dims()
            ),
        ));
    }
    Ok(loss.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?[0])
}

fn failure_of(
    scan: &TensorScan,
    phase: Phase,
    stage: String,
    detail: String,
    t: &Tensor,
) -> crate::Result<Failure> {
    let kind = if scan.nan > 0 {
        FindingKind::Nan
    } else if scan.inf > 0 {
        FindingKind::Inf
    } else {
        FindingKind::Overflow
    };
    Ok(Failure {
        kind,
        phase,
        stage,
        detail,
        stats: Some(TensorStats::of_tensor(t)?),
        coverage: None,
        explanation: None,
    })
}
