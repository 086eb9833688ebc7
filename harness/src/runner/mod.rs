//! One training run of a `Case`, step by step:
//! batch → pathologies → augment → forward → loss → backward → clip → update,
//! with the probe after every stage that can produce a non-finite value.

use crate::augment;
use crate::data::{apply_pathologies, apply_pathology, DataSource, Dataset, HostBatch, HostInput};
use crate::device;
use crate::dump;
use crate::error::{Error, Result};

use crate::losses::{self, UserLoss};
use crate::models::{BuiltinFactory, ModelFactory, ParamStore, Tracer};
use crate::optim::{self, Optimizer};
use crate::outcome::{Finding, FindingKind, Outcome, Phase, Signature, Trace};
use crate::probe::{scan_all, scan_host, DivergenceTracker, TensorStats};
use crate::scaler::LossScaler;
use crate::spec::{dtype_max, Case, DeviceSpec, Limits};
pub use crate::state::Snapshot;
use candle_core::{DType, Device, Tensor, Var};

/// How to run a case.
#[derive(Clone)]
pub struct RunOptions {
    /// Scan gradients, parameters, optimizer state and batches every step.
    /// Off, only the loss is watched (for measuring the probe's cost).
    pub probe: bool,
    /// Run on this device instead of the case's.
    pub device: Option<DeviceSpec>,
    pub limits: Limits,
    /// Write a crash dump of the first failure here (the directory must not exist).
    pub dump: Option<std::path::PathBuf>,
    /// With `dump`: dump this step's scene whether or not it fails (a
    /// failure before it is dumped instead, as without `dump_at`).
    pub dump_at: Option<usize>,
    /// Re-run a failing step in f32 (for half precision) and f64 and mark
    /// the finding with the result ([`crate::fidelity`]). Off where only
    /// stable-or-not matters (LR searches, minimization).
    pub fidelity: bool,
    /// Stop at divergence. Off, only non-finite values end a run, and the
    /// caller judges divergence from the loss history (LR tables need both
    /// answers from one run).
    pub watch_divergence: bool,
    /// Probe as on an accelerator even on the CPU: one device→host copy per
    /// step, the update checked at the next step's copy. This is what
    /// accelerators always do; on the CPU it exists so tests can check that
    /// path (the CPU otherwise scans memory in place).
    pub accelerator_probe: bool,
    /// The dataset of a case whose `data.source` is `user` (the caller's
    /// own data, behind [`Dataset`]).
    pub dataset: Option<std::sync::Arc<dyn Dataset>>,
    /// The loss of a case whose `loss` is `custom` (the caller's closure).
    pub loss: Option<std::sync::Arc<dyn UserLoss>>,
    /// Guard one recorded stage of the model every step ([`crate::intervention`]).
    pub intervention: Option<std::sync::Arc<crate::intervention::Intervention>>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("probe", &self.probe)
            .field("device", &self.device)
            .field("limits", &self.limits)
            .field("dump", &self.dump)
            .field("dump_at", &self.dump_at)
            .field("fidelity", &self.fidelity)
            .field("watch_divergence", &self.watch_divergence)
            .field("accelerator_probe", &self.accelerator_probe)
            .field("dataset", &self.dataset.as_ref().map(|d| d.name()))
            .field("loss", &self.loss.as_ref().map(|_| "custom"))
            .field("intervention", &self.intervention)
            .finish()
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            probe: true,
            device: None,
            limits: Limits::default(),
            dump: None,
            dump_at: None,
            fidelity: true,
            watch_divergence: true,
            accelerator_probe: false,
            dataset: None,
            loss: None,
            intervention: None,
        }
    }
}

/// Runs a case of a built-in family with the default options.
pub fn run(case: &Case) -> Result<Outcome> {
    run_with_options(case, &RunOptions::default())
}

pub fn run_with_options(case: &Case, opts: &RunOptions) -> Result<Outcome> {
    match BuiltinFactory::new(&case.model) {
        Some(factory) => run_model(case, &factory, opts),
        None => Ok(Outcome::Rejected {
            reason: "invalid case: field `model.family`: a `custom` model needs its factory (use `run_model`)".into(),
        }),
    }
}

/// Runs a case with a caller-provided model (a user's own candle model).
pub fn run_model(case: &Case, factory: &dyn ModelFactory, opts: &RunOptions) -> Result<Outcome> {
    let mut session = match Session::new(case, factory, opts) {
        Ok(s) => s,
        Err(e @ (Error::InvalidCase { .. } | Error::Data { .. })) => {
            return Ok(Outcome::Rejected {
                reason: e.to_string(),
            })
        }
        Err(e) => return Err(e),
    };
    if let Some(dir) = &opts.dump {
        dump::ensure_free(dir)?;
    }
    if let Some(at) = opts.dump_at {
        if opts.dump.is_none() {
            return Err(Error::invalid("dump_at", "needs a dump directory"));
        }
        if at >= case.steps {
            return Err(Error::invalid(
                "dump_at",
                format!("step {at} is outside the case's {} steps", case.steps),
            ));
        }
    }
    let mut failed = None;
    for step in 0..case.steps {
        let before = match opts.dump_at {
            Some(at) if at == step => Some(session.snapshot()?),
            _ => None,
        };
        if let Some(finding) = session.step(step)? {
            // Without the probe only this snapshot holds the state before.
            if session.failed_before.is_none() {
                session.failed_before = before;
            }
            failed = Some(finding);
            break;
        }
        if let (Some(before), Some(dir)) = (before, &opts.dump) {
            session.write_step_dump(dir, step, &before, None)?;
        }
    }
    if failed.is_none() {
        failed = session.finish()?;
    }
    if failed.is_none() {
        failed = session.unrecovered_explosion();
    }
    if let Some(mut finding) = failed {
        if let (true, Some(before)) = (opts.fidelity, session.failed_before()) {
            let check = crate::fidelity::check(&session.case, factory, opts, &finding, before)?;
            finding.precision = Some(Box::new(check));
        }
        // A failure at or before the asked-for step is what gets dumped.
        let dumped = opts.dump_at.is_some_and(|at| at < finding.step);
        if let (Some(dir), false) = (&opts.dump, dumped) {
            session.write_dump(dir, &finding)?;
        }
        return Ok(Outcome::Unstable {
            finding: Box::new(finding),
        });
    }
    Ok(Outcome::Stable {
        trace: session.into_trace(),
    })
}

/// The batch rows (samples) with a value that `bad` flags.
fn bad_samples(values: &[f32], dims: &[usize], bad: impl Fn(f32) -> bool) -> Vec<usize> {
    let per = values.len() / dims.first().copied().unwrap_or(1).max(1);
    values
        .chunks(per.max(1))
        .enumerate()
        .filter(|(_, row)| row.iter().any(|&v| bad(v)))
        .map(|(i, _)| i)
        .collect()
}

/// A failure seen at a stage, before it becomes a `Finding`.
#[derive(Clone, Debug)]
pub struct Failure {
    pub kind: FindingKind,
    pub phase: Phase,
    pub stage: String,
    /// The op kind of the stage, where known (`conv`, `softmax`, ...).
    pub op: Option<String>,
    pub detail: String,
    pub stats: Option<TensorStats>,
    /// A `no_gradient` failure's tensors and where the flow stopped.
    pub coverage: Option<Box<crate::coverage::GradientCoverage>>,
    /// What the producing stage did (a traced re-run's records).
    pub explanation: Option<Box<crate::explain::Explanation>>,
}

impl Failure {
    fn new(
        kind: FindingKind,
        phase: Phase,
        stage: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Failure {
            kind,
            phase,
            stage: stage.into(),
            op: None,
            detail: detail.into(),
            stats: None,
            coverage: None,
            explanation: None,
        }
    }

    fn with_coverage(mut self, coverage: crate::coverage::GradientCoverage) -> Self {
        self.coverage = Some(Box::new(coverage));
        self
    }
}

/// A batch on the device: inputs in the compute dtype, dense targets (and
/// mixup's λ with its second target set) in the loss dtype.
struct DeviceBatch {
    input: Tensor,
    targets: Tensor,
    mix: Option<(f64, Tensor)>,
}

/// The forward pass of one batch.
pub struct Forward {
    /// The batch's inputs as the model received them.
    pub input: Tensor,
    /// The model output as returned by the model.
    pub output: Tensor,
    /// The output as (rows × classes) in the loss dtype.
    pub logits: Tensor,
    /// The scalar loss.
    pub loss: Tensor,
}

/// The run's first jump, kept until the run's end judges it.
struct Jumped {
    jump: crate::explosion::Jump,
    /// The state before the jump's step.
    before: Option<Snapshot>,
    /// The history up to the end of the jump's step (the finding's trace,
    /// as for every finding; the recovery is judged on the whole run).
    through: crate::outcome::TraceMark,
}

/// A training run in progress.
pub struct Session<'a> {
    case: Case,
    device: Device,
    factory: &'a dyn ModelFactory,
    params: ParamStore,
    vars: Vec<Var>,
    names: Vec<String>,
    optimizer: Optimizer,
    scaler: LossScaler,
    source: Box<dyn DataSource>,
    tracker: DivergenceTracker,
    trace: Trace,
    probe: bool,
    watch_divergence: bool,
    /// How the probe reads values back (chosen once: see [`Readback`]).
    readback: Readback,
    /// Accelerator mode: the last completed step, its LR and the state
    /// before it, whose update is checked at the next step's copy.
    unchecked: Option<(usize, f64, Snapshot)>,
    /// Device→host synchronizations made by the probe in accelerator mode.
    syncs: u64,
    compute: DType,
    loss_dtype: DType,
    half: bool,
    /// The state before the last step, kept when that step failed.
    failed_before: Option<Snapshot>,
    /// The caller's loss, for a `custom` loss.
    user_loss: Option<std::sync::Arc<dyn UserLoss>>,
    /// The case's model knobs, for the factory.
    knobs: crate::models::Knobs,
    /// The global parameter norm at initialization (the baseline of the
    /// first update's jump check).
    init_norm: f64,
    /// Σg² of each gradient at the last scanned step.
    grad_sq: Vec<f64>,
    /// The largest of `trace.grad_norms`, kept so that the jump check is
    /// O(1) per step (recomputed when the history is restored).
    grad_norm_max: f64,
    /// The run's first jump (see [`crate::explosion`]), with the state
    /// before its step; judged when the run ends.
    jump: Option<Jumped>,
    /// The stage guarded every step, if any.
    intervention: Option<std::sync::Arc<crate::intervention::Intervention>>,
}

impl<'a> Session<'a> {
    /// Validates the case, opens the device and the data source and
    /// creates the parameters.
    pub fn new(case: &Case, factory: &'a dyn ModelFactory, opts: &RunOptions) -> Result<Self> {
        // Validation names the case's own faults before the data's.
        let case = case.on(opts.device);
        case.validate(&opts.limits)?;
        let max = opts.limits.max_memory_bytes;
        let case = crate::data::pinned(&case, max)?;
        let source = crate::data::open_source(&case, opts.dataset.as_ref(), max)?;
        Session::build(case, factory, opts, source)
    }

    /// Like [`Session::new`], with batches from `source` (a dump's saved batch).
    pub fn with_source(
        case: &Case,
        factory: &'a dyn ModelFactory,
        opts: &RunOptions,
        source: Box<dyn DataSource>,
    ) -> Result<Self> {
        let case = case.on(opts.device);
        case.validate(&opts.limits)?;
        Session::build(case, factory, opts, source)
    }

    /// The session of a validated case, on its device, with its source.
    fn build(
        case: Case,
        factory: &'a dyn ModelFactory,
        opts: &RunOptions,
        source: Box<dyn DataSource>,
    ) -> Result<Self> {
        if let (crate::spec::LossSpec::Custom { name, .. }, None) = (&case.loss, &opts.loss) {
            return Err(Error::invalid(
                "loss",
                format!("the custom loss `{name}` needs its closure (RunOptions::loss)"),
            ));
        }
        let device = device::open(case.device)?;
        let precision = &case.precision;
        let params = ParamStore::new(
            case.seed,
            case.model.init(),
            precision.master_dtype(),
            device.clone(),
        )
        .with_overrides(case.model.init_overrides());
        let knobs = crate::models::Knobs::of(&case.model);
        factory.build_with(params.creating_builder(), &case.model, &knobs)?;
        // Tensors the case declares frozen are not trained and need no gradient.
        let frozen = case.model.frozen();
        let trainable: Vec<(String, Var)> = params
            .trainable()
            .into_iter()
            .filter(|(n, _)| !crate::coverage::declared_frozen(n, frozen))
            .collect();
        if trainable.is_empty() {
            return Err(Error::invalid(
                "model",
                "the model has no trainable parameters",
            ));
        }
        let count = params.count();
        if count > opts.limits.max_params {
            return Err(Error::invalid(
                "model",
                format!(
                    "{count} parameters exceed the limit of {}",
                    opts.limits.max_params
                ),
            ));
        }
        let (names, vars): (Vec<String>, Vec<Var>) = trainable.into_iter().unzip();
        let compute = precision.compute_dtype();
        let init_norm = crate::probe::global_norm(&scan_all(
            &vars.iter().map(|v| v.as_tensor()).collect::<Vec<_>>(),
        )?);
        Ok(Session {
            init_norm,
            grad_sq: Vec::new(),
            grad_norm_max: 0.0,
            jump: None,
            intervention: opts.intervention.clone(),
            optimizer: Optimizer::new(&case.optimizer, vars.len()),
            scaler: LossScaler::new(precision.loss_scaling()),
            source,
            tracker: DivergenceTracker::new(case.divergence_factor),
            trace: Trace::default(),
            probe: opts.probe,
            watch_divergence: opts.watch_divergence,
            readback: if opts.accelerator_probe || !device.is_cpu() {
                Readback::Deferred
            } else {
                Readback::InPlace
            },
            unchecked: None,
            syncs: 0,
            loss_dtype: precision.loss_dtype(),
            half: matches!(compute, DType::F16 | DType::BF16),
            failed_before: None,
            user_loss: opts.loss.clone(),
            knobs,
            compute,
            case,
            device,
            factory,
            params,
            vars,
            names,
        })
    }

    pub fn case(&self) -> &Case {
        &self.case
    }

    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    pub fn into_trace(mut self) -> Trace {
        if self.case.precision.loss_scaling().is_some() {
            self.trace.loss_scale = Some(self.scaler.scale);
        }
        self.trace
    }

    /// The batch of `step` after pathologies and augmentation, or the
    /// failure the probe saw while making it.
    pub fn batch(&self, step: usize) -> Result<std::result::Result<HostBatch, Box<Failure>>> {
        self.batch_checked(step, false)
    }

    /// The batch of `step` before pathologies and augmentation.
    pub fn raw_batch(&self, step: usize) -> Result<HostBatch> {
        self.source.batch(step, self.case.batch_size)
    }

    /// The batch of `step` without any check (for dumps).
    pub fn batch_unchecked(&self, step: usize) -> Result<HostBatch> {
        let case = &self.case;
        let mut batch = self.raw_batch(step)?;
        apply_pathologies(&mut batch, &case.data.pathologies, case.seed, step);
        augment::apply_all(&mut batch, &case.augment, case.seed, step);
        Ok(batch)
    }

    /// The run's data source.
    pub fn source(&self) -> &dyn DataSource {
        &*self.source
    }

    /// Makes the batch, checking it after the data and after every
    /// augmentation; `fine` also checks the source's output and each
    /// pathology on its own (localization).
    fn batch_checked(
        &self,
        step: usize,
        fine: bool,
    ) -> Result<std::result::Result<HostBatch, Box<Failure>>> {
        let case = &self.case;
        let mut batch = self.raw_batch(step)?;
        Ok((|| {
            if fine {
                self.check_batch(&batch, Phase::Data, case.data.source.stage())?;
                for (i, p) in case.data.pathologies.iter().enumerate() {
                    apply_pathology(&mut batch, i, p, case.seed, step);
                    self.check_batch(
                        &batch,
                        Phase::Data,
                        &format!("data.pathologies[{i}].{}", p.name()),
                    )?;
                }
            } else {
                apply_pathologies(&mut batch, &case.data.pathologies, case.seed, step);
            }
            if self.probe {
                self.check_batch(&batch, Phase::Data, "input")?;
            }
            for (i, aug) in case.augment.iter().enumerate() {
                augment::apply(&mut batch, aug, case.seed, i, step);
                if self.probe {
                    self.check_batch(
                        &batch,
                        Phase::Augment,
                        &format!("augment[{i}].{}", aug.name()),
                    )?;
                }
            }
            Ok(batch)
        })())
    }

    /// " (samples 3 and 9 of train.safetensors)" for a batch drawn from a
    /// dataset; nothing for synthetic data.
    fn samples_named(&self, batch: &HostBatch, bad: &[usize]) -> String {
        match self.source.dataset() {
            Some(d) if !bad.is_empty() => {
                let ids: Vec<usize> = bad
                    .iter()
                    .filter_map(|&s| batch.samples.get(s).copied())
                    .collect();
                format!(" ({} of {})", crate::data::samples_phrase(&ids), d.name())
            }
            _ => String::new(),
        }
    }

    fn check_batch(
        &self,
        batch: &HostBatch,
        phase: Phase,
        stage: &str,
    ) -> std::result::Result<(), Box<Failure>> {
        if phase == Phase::Data {
            if let Some((row, &label)) = batch
                .labels
                .iter()
                .enumerate()
                .find(|(_, &l)| l < 0 || l >= batch.classes as i64)
            {
                let at = if stage == "input" { "labels" } else { stage };
                let per_sample = (batch.labels.len() / batch.samples.len().max(1)).max(1);
                return Err(Box::new(Failure::new(
                    FindingKind::InvalidLabel,
                    phase,
                    at,
                    format!(
                        "label {label} in row {row}{} is outside the {} classes",
                        self.samples_named(batch, &[row / per_sample]),
                        batch.classes
                    ),
                )));
            }
        }
        let HostInput::Real { values, dims } = &batch.input else {
            return Ok(());
        };
        let s = scan_host(values);
        let limit = dtype_max(self.compute);
        if s.is_finite() && s.max_abs <= limit {
            return Ok(());
        }
        let (kind, detail) = if !s.is_finite() {
            (
                if s.nan > 0 {
                    FindingKind::Nan
                } else {
                    FindingKind::Inf
                },
                format!(
                    "{} NaN and {} Inf values in the batch inputs{}",
                    s.nan,
                    s.inf,
                    self.samples_named(batch, &bad_samples(values, dims, |v| !v.is_finite()))
                ),
            )
        } else {
            (
                FindingKind::Overflow,
                format!(
                    "input magnitude {:.3e} exceeds the largest {:?} value {limit:.3e}{}",
                    s.max_abs,
                    self.compute,
                    self.samples_named(
                        batch,
                        &bad_samples(values, dims, |v| f64::from(v.abs()) > limit)
                    )
                ),
            )
        };
        Err(Box::new(Failure {
            stats: Some(TensorStats::of_host(dims, values)),
            ..Failure::new(kind, phase, stage, detail)
        }))
    }

    fn upload(&self, batch: &HostBatch) -> Result<DeviceBatch> {
        let input = match &batch.input {
            HostInput::Real { values, dims } => {
                Tensor::from_slice(values, dims.as_slice(), &self.device)?.to_dtype(self.compute)?
            }
            HostInput::Tokens { ids, dims } => {
                Tensor::from_slice(ids, dims.as_slice(), &self.device)?
            }
        };
        let shape = (batch.rows(), batch.classes);
        let targets =
            Tensor::from_slice(&batch.targets, shape, &self.device)?.to_dtype(self.loss_dtype)?;
        let mix = match &batch.mix {
            Some((lam, t2)) => Some((
                *lam,
                Tensor::from_slice(t2, shape, &self.device)?.to_dtype(self.loss_dtype)?,
            )),
            None => None,
        };
        Ok(DeviceBatch {
            input,
            targets,
            mix,
        })
    }

    /// Builds the model from the current parameters and computes the loss of
    /// a batch: (model output, logits as rows × classes, loss).
    pub fn forward_loss(&self, batch: &HostBatch, tracer: &mut Tracer) -> Result<Forward> {
        let DeviceBatch {
            input,
            targets,
            mix,
        } = self.upload(batch)?;
        let model = self.factory.build_with(
            self.params.compute_builder(self.compute),
            &self.case.model,
            &self.knobs,
        )?;
        let output = model.forward(&input, tracer)?;
        let logits = match output.rank() {
            3 => output.flatten(0, 1)?,
            _ => output.clone(),
        }
        .to_dtype(self.loss_dtype)?;
        if logits.dims() != targets.dims() {
            let hint = if output.rank() == 3 && !self.case.model.per_token() {
                "; for one prediction per position set the model's `per_token: true`"
            } else if output.rank() == 2 && self.case.model.per_token() {
                "; a per-token model returns (batch, positions, outputs)"
            } else {
                ""
            };
            return Err(Error::invalid(
                "model",
                format!(
                    "the model returned shape {:?}, which gives logits {:?}; the loss takes {:?} (rows x classes){hint}",
                    output.dims(),
                    logits.dims(),
                    targets.dims()
                ),
            ));
        }
        let mix = mix.as_ref().map(|(l, t)| (*l, t));
        let loss = losses::batch_loss(
            &self.case.loss,
            self.user_loss.as_deref(),
            &logits,
            &targets,
            mix,
        )?;
        Ok(Forward {
            input,
            output,
            logits,
            loss,
        })
    }

    /// The trainable variables and their names, in creation order.
    pub fn vars(&self) -> (&[String], &[Var]) {
        (&self.names, &self.vars)
    }

    /// Runs one step; returns the finding when the probe saw a failure.
    ///
    /// With the probe on, the state before the step is kept; a failing step
    /// is re-run from it with tracing on to name the first producer.
    pub fn step(&mut self, step: usize) -> Result<Option<Finding>> {
        let lr = optim::lr_at(
            &self.case.schedule,
            self.case.optimizer.lr(),
            step,
            self.case.steps,
        );
        let before = if self.probe {
            Some(self.snapshot()?)
        } else {
            None
        };
        let seen = (self.trace.grad_norms.len(), self.trace.param_norms.len());
        let mark = self.trace.mark();
        let mut tracer = Tracer::off().with_intervention(self.intervention.clone());
        // A guarded stage is reached from any depth of the user's code too.
        let shared = tracer.active().then(|| crate::trace::share(&tracer));
        let inner = self.step_inner(step, lr, &mut tracer, false);
        drop(shared);
        let failure = match inner? {
            None => {
                if self.readback == Readback::Deferred {
                    let previous = self.unchecked.take();
                    self.watch_jumps(step, (seen, mark), before.as_ref(), previous.map(|p| p.2))?;
                    self.unchecked = before.map(|b| (step, lr, b));
                } else {
                    self.watch_jumps(step, (seen, mark), before.as_ref(), None)?;
                }
                return Ok(None);
            }
            Some(Failed::ThisStep(failure)) => failure,
            Some(Failed::PreviousUpdate(failure)) => {
                // The previous step's update failed; this step's copy saw it.
                let (prev, prev_lr, prev_before) = self
                    .unchecked
                    .take()
                    .expect("a deferred check follows a completed step");
                let localized = self.localize(prev, prev_lr, &prev_before, &failure)?;
                self.failed_before = Some(prev_before);
                return Ok(Some(self.finding(prev, localized)));
            }
        };
        let failure = match before {
            Some(snapshot) => {
                let localized = self.localize(step, lr, &snapshot, &failure)?;
                self.failed_before = Some(snapshot);
                localized
            }
            None => *failure,
        };
        Ok(Some(self.finding(step, failure)))
    }

    /// Ends a run: in accelerator mode the last step's update has not been
    /// checked yet (one more synchronization). Returns its finding, if any.
    pub fn finish(&mut self) -> Result<Option<Finding>> {
        let Some((step, lr, before)) = self.unchecked.take() else {
            return Ok(None);
        };
        self.syncs += 1;
        let Some(failure) = self.check_update()? else {
            return Ok(None);
        };
        let localized = self.localize(step, lr, &before, &failure)?;
        self.failed_before = Some(before);
        Ok(Some(self.finding(step, localized)))
    }

    /// After a healthy step: the run's first jump of the gradient norm
    /// (this step's against the largest before it) or of the parameter
    /// norm (the newest against the one before, or the initialization's).
    /// `seen` are the norms' counts and `mark` the history before the step;
    /// `previous` is the state before the previous step, whose update a
    /// deferred readback checks at this one.
    fn watch_jumps(
        &mut self,
        step: usize,
        (seen, mark): ((usize, usize), crate::outcome::TraceMark),
        before: Option<&Snapshot>,
        previous: Option<Snapshot>,
    ) -> Result<()> {
        use crate::explosion::{is_jump, Grew, Jump};
        if !self.probe || !self.watch_divergence || self.jump.is_some() {
            return Ok(());
        }
        let (g, p) = seen;
        let now = self.trace.mark();
        let grads = &self.trace.grad_norms;
        // Against the run's largest so far: a gradient that was tiny one
        // step (a fitted batch) and typical the next is no jump.
        let baseline = self.grad_norm_max;
        self.grad_norm_max = grads[g..].iter().copied().fold(baseline, f64::max);
        if grads.len() > g && is_jump(baseline, grads[g]) {
            let largest = (0..self.grad_sq.len())
                .max_by(|&a, &b| self.grad_sq[a].total_cmp(&self.grad_sq[b]))
                .unwrap_or(0);
            let jump = Jump {
                step,
                grew: Grew::GradientNorm,
                before: baseline,
                after: grads[g],
                tensor: self.names[largest].clone(),
            };
            self.jump = Some(Jumped {
                jump,
                before: before.cloned(),
                through: now,
            });
            return Ok(());
        }
        let params = &self.trace.param_norms;
        if params.len() <= p {
            return Ok(());
        }
        let last = if p == 0 {
            self.init_norm
        } else {
            params[p - 1]
        };
        if !is_jump(last, params[p]) {
            return Ok(());
        }
        // Read in place, this step's update; deferred, the previous step's.
        let (at, snapshot, through) = match self.readback {
            Readback::InPlace => (step, before.cloned(), now),
            Readback::Deferred => (step.saturating_sub(1), previous, mark),
        };
        let tensor = match &snapshot {
            Some(s) => self.fastest_growing(&s.params)?,
            None => String::new(),
        };
        let jump = Jump {
            step: at,
            grew: Grew::ParameterNorm,
            before: last,
            after: params[p],
            tensor,
        };
        self.jump = Some(Jumped {
            jump,
            before: snapshot,
            through,
        });
        Ok(())
    }

    /// The parameter whose norm grew by the most against `earlier` (in
    /// absolute terms: the one that carries the explosion, not a bias
    /// that grew from nearly nothing).
    fn fastest_growing(&self, earlier: &[Tensor]) -> Result<String> {
        let now: Vec<&Tensor> = self.vars.iter().map(|v| v.as_tensor()).collect();
        let then: Vec<&Tensor> = earlier.iter().collect();
        let (now, then) = (scan_all(&now)?, scan_all(&then)?);
        let growth = |i: usize| now[i].sum_sq.sqrt() - then[i].sum_sq.sqrt();
        let i = (0..now.len())
            .max_by(|&a, &b| growth(a).total_cmp(&growth(b)))
            .unwrap_or(0);
        Ok(self.names[i].clone())
    }

    /// The run's first jump, if it had one.
    pub fn jump(&self) -> Option<&crate::explosion::Jump> {
        self.jump.as_ref().map(|j| &j.jump)
    }

    /// At the end of a run without a finding: its jump, if the loss never
    /// recovered from it, as an `explosion` finding (the state before its
    /// step kept for dumps and the precision check).
    pub fn unrecovered_explosion(&mut self) -> Option<Finding> {
        let jump = &self.jump.as_ref()?.jump;
        let r = crate::explosion::Recovery::of(&self.trace.losses, jump.step)?;
        if r.recovered() {
            return None;
        }
        let recovery = format!(
            ", and the loss never recovered: its best mean over {} steps after it is {:.4e}, against {:.4e} before",
            crate::explosion::RECOVERY_WINDOW,
            r.best_after,
            r.best_before
        );
        self.explosion_finding(&recovery)
    }

    /// The run's jump as an `explosion` finding, unjudged: a replay of its
    /// step sees the jump, not the steps after it.
    pub fn jump_finding(&mut self) -> Option<Finding> {
        self.explosion_finding(" (the jump alone: recovery is judged over a whole run)")
    }

    fn explosion_finding(&mut self, judged: &str) -> Option<Finding> {
        let Jumped {
            jump,
            before,
            through,
        } = self.jump.take()?;
        self.failed_before = before;
        let phase = match jump.grew {
            crate::explosion::Grew::GradientNorm => Phase::Backward,
            crate::explosion::Grew::ParameterNorm => Phase::Update,
        };
        let detail = format!("{}{judged}", jump.describe());
        let mut f = self.finding(
            jump.step,
            Failure::new(FindingKind::Explosion, phase, jump.stage(), detail),
        );
        let scale = f.trace.loss_scale;
        f.trace = f.trace.upto(through);
        f.trace.loss_scale = scale;
        Some(f)
    }

    /// Device→host synchronizations the probe made in accelerator mode
    /// (one per step, one at `finish`, more only around a failure).
    pub fn host_syncs(&self) -> u64 {
        self.syncs
    }

    /// The state now (parameters copied, the rest cloned).
    pub fn snapshot(&self) -> Result<Snapshot> {
        Ok(Snapshot {
            params: self
                .vars
                .iter()
                .map(|v| v.as_tensor().copy())
                .collect::<candle_core::Result<_>>()?,
            optimizer: self.optimizer.clone(),
            scaler: self.scaler.clone(),
            tracker: self.tracker.clone(),
            history: self.trace.mark(),
        })
    }

    /// Replaces the run's history (a replay starts from a dump's).
    pub fn set_history(&mut self, trace: Trace) {
        self.trace = trace;
        self.grad_norm_max = self.largest_grad_norm();
    }

    fn largest_grad_norm(&self) -> f64 {
        self.trace.grad_norms.iter().copied().fold(0.0, f64::max)
    }

    /// Puts the session back into a snapshot's state.
    pub fn restore(&mut self, snapshot: &Snapshot) -> Result<()> {
        for (var, value) in self.vars.iter().zip(&snapshot.params) {
            var.set(value)?;
        }
        self.optimizer = snapshot.optimizer.clone();
        self.scaler = snapshot.scaler.clone();
        self.tracker = snapshot.tracker.clone();
        self.trace.truncate(snapshot.history);
        self.grad_norm_max = self.largest_grad_norm();
        Ok(())
    }

    /// Writes the crash dump of the step that failed.
    pub fn write_dump(&self, dir: &std::path::Path, finding: &Finding) -> Result<()> {
        let before = self.failed_before.as_ref().ok_or_else(|| {
            Error::invalid(
                "dump",
                "the run has no failed step to dump (was the probe on?)",
            )
        })?;
        self.write_step_dump(dir, finding.step, before, Some(finding))
    }

    /// Writes the scene of `step` (run from `before`), with its finding if
    /// it failed.
    pub fn write_step_dump(
        &self,
        dir: &std::path::Path,
        step: usize,
        before: &Snapshot,
        finding: Option<&Finding>,
    ) -> Result<()> {
        let trace = finding.map_or(&self.trace, |f| &f.trace);
        dump::write(
            dir,
            &dump::Scene {
                case: &self.case,
                names: &self.names,
                step,
                before,
                trace,
                batch: self.batch_unchecked(step)?,
                raw: self.raw_batch(step)?,
                finding,
            },
        )
    }

    /// The state before the step that failed (after `step` returned a finding).
    pub fn failed_before(&self) -> Option<&Snapshot> {
        self.failed_before.as_ref()
    }

    /// Re-runs a failed step from `before` with tracing on; the traced run's
    /// failure names the first producer. Divergence has no producer.
    fn localize(
        &mut self,
        step: usize,
        lr: f64,
        before: &Snapshot,
        first: &Failure,
    ) -> Result<Failure> {
        if first.kind == FindingKind::Divergence {
            return Ok(first.clone());
        }
        let after = self.snapshot()?;
        let history = self.trace.clone();
        self.restore(before)?;
        let mut tracer = Tracer::on().with_intervention(self.intervention.clone());
        // `nanhunt::trace` calls in a user's model record into it too.
        let shared = crate::trace::share(&tracer);
        // A traced re-run reads values in place: its failure is this step's.
        let traced = self.step_inner(step, lr, &mut tracer, true);
        drop(shared);
        let traced = traced?;
        self.restore(&after)?;
        self.trace = history;
        Ok(match traced.map(Failed::into_failure) {
            Some(f) => *f,
            None => Failure {
                detail: format!("{} (not reproduced under tracing)", first.detail),
                ..first.clone()
            },
        })
    }

    /// Scans parameters and optimizer state after an update.
    /// What an update changes: the parameters, then the optimizer state.
    fn update_tensors(&self) -> Vec<&Tensor> {
        let mut tensors: Vec<&Tensor> = self.vars.iter().map(|v| v.as_tensor()).collect();
        tensors.extend(self.optimizer.state_tensors().map(|(_, _, t)| t));
        tensors
    }

    /// Scans parameters (whose norm goes into the trace) and optimizer
    /// state after an update.
    fn check_update(&mut self) -> Result<Option<Failure>> {
        let failure = {
            let tensors = self.update_tensors();
            let n = self.vars.len();
            let params = scan_all(&tensors[..n])?;
            // The optimizer state's finiteness from the bits; its statistics only for a failure.
            let bad = match params.iter().position(|s| !s.is_finite()) {
                Some(i) => Some(i),
                None => crate::probe::first_non_finite(&tensors[n..])?.map(|i| n + i),
            };
            match bad {
                None => {
                    self.trace
                        .param_norms
                        .push(crate::probe::global_norm(&params));
                    None
                }
                Some(i) => {
                    let scan = scan_all(&[tensors[i]])?[0];
                    Some(self.namer().update_failure(i, &scan, tensors[i])?)
                }
            }
        };
        Ok(failure)
    }

    /// The view of this session that names failures.
    fn namer(&self) -> Namer<'_> {
        Namer {
            case: &self.case,
            names: &self.names,
            optimizer: &self.optimizer,
            half: self.half,
        }
    }

    fn finding(&self, step: usize, f: Failure) -> Finding {
        let signature = Signature {
            kind: f.kind,
            phase: f.phase,
            stage: match self.case.model {
                crate::spec::ModelSpec::Custom(_) => crate::outcome::user_stage_key(&f.stage),
                _ => crate::outcome::stage_key(&f.stage),
            },
            family: self.case.family().to_string(),
            optimizer: self.case.optimizer.name().to_string(),
            precision: self.case.precision.name().to_string(),
            device: self.case.device.to_string(),
        };
        let mut trace = self.trace.clone();
        if self.case.precision.loss_scaling().is_some() {
            trace.loss_scale = Some(self.scaler.scale);
        }
        Finding {
            step,
            kind: f.kind,
            phase: f.phase,
            stage: f.stage,
            op: f.op,
            detail: f.detail,
            stats: f.stats,
            coverage: f.coverage,
            precision: None,
            explanation: f.explanation,
            signature,
            trace,
        }
    }
}

mod naming;
mod step;

use naming::Namer;
use step::{Failed, Readback};

#[cfg(test)]
mod tests;
