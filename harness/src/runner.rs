//! One training run of a `Case`, step by step:
//! batch → pathologies → augment → forward → loss → backward → clip → update,
//! with the probe after every stage that can produce a non-finite value.

use crate::augment;
use crate::data::{apply_pathologies, apply_pathology, Generator, HostBatch, HostInput};
use crate::device;
use crate::dump;
use crate::error::{Error, Result};
use crate::localize;
use crate::losses;
use crate::models::{BuiltinFactory, ModelFactory, ParamStore, Tracer};
use crate::optim::{self, Optimizer};
use crate::outcome::{Finding, FindingKind, Outcome, Phase, Signature, Trace};
use crate::probe::{scan_all, scan_host, DivergenceTracker, TensorScan, TensorStats};
use crate::scaler::{LossScaler, ScaleVerdict};
use crate::spec::{dtype_max, Case, ClipSpec, DeviceSpec, Limits};
pub use crate::state::Snapshot;
use candle_core::{DType, Device, Tensor, Var};

/// How to run a case.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Scan gradients, parameters, optimizer state and batches every step.
    /// Off, only the loss is watched (for measuring the probe's cost).
    pub probe: bool,
    /// Run on this device instead of the case's.
    pub device: Option<DeviceSpec>,
    pub limits: Limits,
    /// Write a crash dump of the first failure here (the directory must not exist).
    pub dump: Option<std::path::PathBuf>,
    /// Stop at divergence. Off, only non-finite values end a run, and the
    /// caller judges divergence from the loss history (LR tables need both
    /// answers from one run).
    pub watch_divergence: bool,
    /// Probe as on an accelerator even on the CPU: one device→host copy per
    /// step, the update checked at the next step's copy. This is what
    /// accelerators always do; on the CPU it exists so tests can check that
    /// path (the CPU otherwise scans memory in place).
    pub accelerator_probe: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            probe: true,
            device: None,
            limits: Limits::default(),
            dump: None,
            watch_divergence: true,
            accelerator_probe: false,
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
        Err(e @ Error::InvalidCase { .. }) => {
            return Ok(Outcome::Rejected {
                reason: e.to_string(),
            })
        }
        Err(e) => return Err(e),
    };
    if let Some(dir) = &opts.dump {
        dump::ensure_free(dir)?;
    }
    let mut failed = None;
    for step in 0..case.steps {
        if let Some(finding) = session.step(step)? {
            failed = Some(finding);
            break;
        }
    }
    if failed.is_none() {
        failed = session.finish()?;
    }
    if let Some(finding) = failed {
        if let Some(dir) = &opts.dump {
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
        }
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
    /// The model output as returned by the model.
    pub output: Tensor,
    /// The output as (rows × classes) in the loss dtype.
    pub logits: Tensor,
    /// The scalar loss.
    pub loss: Tensor,
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
    generator: Generator,
    tracker: DivergenceTracker,
    trace: Trace,
    probe: bool,
    watch_divergence: bool,
    /// One host synchronization per step (accelerators; see RunOptions).
    accelerator: bool,
    /// Accelerator mode: the last completed step, its LR and the state
    /// before it, whose update is checked at the next step's copy.
    unchecked: Option<(usize, f64, Snapshot)>,
    /// Device→host synchronizations made by the probe in accelerator mode.
    syncs: u64,
    /// Set by `step_inner` when its failure belongs to the previous step's update.
    deferred_hit: bool,
    compute: DType,
    loss_dtype: DType,
    half: bool,
    /// The state before the last step, kept when that step failed.
    failed_before: Option<Snapshot>,
}

impl<'a> Session<'a> {
    /// Validates the case, opens the device and creates the parameters.
    pub fn new(case: &Case, factory: &'a dyn ModelFactory, opts: &RunOptions) -> Result<Self> {
        let case = case.on(opts.device);
        case.validate(&opts.limits)?;
        let device = device::open(case.device)?;
        let precision = &case.precision;
        let params = ParamStore::new(
            case.seed,
            case.model.init(),
            precision.master_dtype(),
            device.clone(),
        );
        factory.build(params.creating_builder())?;
        let trainable = params.trainable();
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
        Ok(Session {
            optimizer: Optimizer::new(&case.optimizer, vars.len()),
            scaler: LossScaler::new(precision.loss_scaling()),
            generator: Generator::new(&case),
            tracker: DivergenceTracker::new(case.divergence_factor),
            trace: Trace::default(),
            probe: opts.probe,
            watch_divergence: opts.watch_divergence,
            accelerator: opts.accelerator_probe || !device.is_cpu(),
            unchecked: None,
            syncs: 0,
            deferred_hit: false,
            loss_dtype: precision.loss_dtype(),
            half: matches!(compute, DType::F16 | DType::BF16),
            failed_before: None,
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
    pub fn batch(&self, step: usize) -> std::result::Result<HostBatch, Box<Failure>> {
        self.batch_checked(step, false)
    }

    /// The batch of `step` without any check (for dumps).
    pub fn batch_unchecked(&self, step: usize) -> HostBatch {
        let case = &self.case;
        let mut batch = self.generator.data_batch(step, case.batch_size);
        augment::apply_all(&mut batch, &case.augment, case.seed, step);
        batch
    }

    /// Makes the batch, checking it after the data and after every
    /// augmentation; `fine` also checks the generator's output and each
    /// pathology on its own (localization).
    fn batch_checked(
        &self,
        step: usize,
        fine: bool,
    ) -> std::result::Result<HostBatch, Box<Failure>> {
        let case = &self.case;
        let mut batch = self.generator.batch(step, case.batch_size);
        if fine {
            self.check_batch(&batch, Phase::Data, "data.generator")?;
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
                return Err(Box::new(Failure::new(
                    FindingKind::InvalidLabel,
                    phase,
                    at,
                    format!(
                        "label {label} in row {row} is outside the {} classes",
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
                format!("{} NaN and {} Inf values in the batch inputs", s.nan, s.inf),
            )
        } else {
            (
                FindingKind::Overflow,
                format!(
                    "input magnitude {:.3e} exceeds the largest {:?} value {limit:.3e}",
                    s.max_abs, self.compute
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
        let model = self
            .factory
            .build(self.params.compute_builder(self.compute))?;
        let output = model.forward(&input, tracer)?;
        let logits = match output.rank() {
            3 => output.flatten(0, 1)?,
            _ => output.clone(),
        }
        .to_dtype(self.loss_dtype)?;
        let mix = mix.as_ref().map(|(l, t)| (*l, t));
        let loss = losses::batch_loss(&self.case.loss, &logits, &targets, mix)?;
        Ok(Forward {
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
        let Some(failure) = self.step_inner(step, lr, &mut Tracer::off(), false)? else {
            if self.accelerator {
                self.unchecked = before.map(|b| (step, lr, b));
            }
            return Ok(None);
        };
        if std::mem::take(&mut self.deferred_hit) {
            // The previous step's update failed; this step's copy saw it.
            let (prev, prev_lr, prev_before) = self
                .unchecked
                .take()
                .expect("a deferred check follows a completed step");
            let localized = self.localize(prev, prev_lr, &prev_before, &failure)?;
            self.failed_before = Some(prev_before);
            return Ok(Some(self.finding(prev, localized)));
        }
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
        dump::write(
            dir,
            &dump::Scene {
                case: &self.case,
                names: &self.names,
                before,
                history: finding.trace.upto(before.history),
                batch: self.batch_unchecked(finding.step),
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
        let mut tracer = Tracer::on();
        let traced = self.step_inner(step, lr, &mut tracer, true)?;
        self.restore(&after)?;
        self.trace = history;
        Ok(match traced {
            Some(f) => *f,
            None => Failure {
                detail: format!("{} (not reproduced under tracing)", first.detail),
                ..first.clone()
            },
        })
    }

    /// One step. `fine` (localization) checks the data stage by stage and
    /// analyses the tracer's records when the loss or a gradient fails.
    fn step_inner(
        &mut self,
        step: usize,
        lr: f64,
        tracer: &mut Tracer,
        fine: bool,
    ) -> Result<Option<Box<Failure>>> {
        self.trace.lrs.push(lr);
        let batch = match self.batch_checked(step, fine) {
            Ok(b) => b,
            Err(f) => return Ok(Some(f)),
        };
        let Forward {
            output,
            logits,
            loss,
        } = self.forward_loss(&batch, tracer)?;
        // Accelerator mode reads the loss with the gradients, below.
        let fast = self.accelerator && !fine;
        let mut loss_value = f64::NAN;
        if !fast {
            loss_value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            self.trace.losses.push(loss_value);
            // In execution order the forward stages come first: a non-finite
            // stage output is the producer even when a later op masked it
            // (relu(NaN) is 0 in candle) and the failure surfaced downstream.
            if fine && localize::first_forward(tracer.records())?.is_some() {
                return Ok(Some(Box::new(
                    self.forward_failure(&output, &logits, loss_value, tracer)?,
                )));
            }
            if !loss_value.is_finite() {
                return Ok(Some(Box::new(
                    self.forward_failure(&output, &logits, loss_value, tracer)?,
                )));
            }
        }

        // Backward.
        let scale = self.scaler.scale;
        let scaled = if scale != 1.0 {
            (&loss * scale)?
        } else {
            loss.clone()
        };
        let grad_store = scaled.backward()?;
        let mut grads = Vec::with_capacity(self.vars.len());
        for (var, name) in self.vars.iter().zip(&self.names) {
            match grad_store.get(var.as_tensor()) {
                Some(g) => grads.push(g.clone()),
                None => {
                    return Err(Error::MissingGradient {
                        param: name.clone(),
                    })
                }
            }
        }

        let mut fused = None;
        if fast {
            // The one synchronization of the step: the loss, the gradients
            // and (for the previous step's update) parameters and optimizer
            // state, reduced on the device and copied back together.
            let n = grads.len();
            let (value, scans, previous) = {
                let mut tensors: Vec<&Tensor> = grads.iter().collect();
                if self.probe && self.unchecked.is_some() {
                    tensors.extend(self.update_tensors());
                }
                let (value, scans) = crate::probe::scan_step(&loss, &tensors)?;
                let previous = match scans[n..].iter().position(|s| !s.is_finite()) {
                    Some(i) => Some(self.update_failure(i, &scans[n + i], tensors[n + i])?),
                    None => None,
                };
                (value, scans, previous)
            };
            self.syncs += 1;
            if let Some(f) = previous {
                self.trace.lrs.pop();
                self.deferred_hit = true;
                return Ok(Some(Box::new(f)));
            }
            loss_value = value;
            self.trace.losses.push(loss_value);
            if !loss_value.is_finite() {
                return Ok(Some(Box::new(
                    self.forward_failure(&output, &logits, loss_value, tracer)?,
                )));
            }
            fused = Some(scans[..n].to_vec());
        }
        let scaling = self.case.precision.loss_scaling().is_some();
        let needs_scan = self.probe
            || scale != 1.0
            || matches!(self.case.clip, ClipSpec::Norm { .. })
            || scaling;
        let mut norm = None;
        if needs_scan {
            let scans = match fused {
                Some(scans) => scans,
                None => scan_all(&grads.iter().collect::<Vec<_>>())?,
            };
            let bad = scans.iter().position(|s| !s.is_finite());
            let verdict = if scaling {
                self.scaler.update(bad.is_none())
            } else if bad.is_none() {
                ScaleVerdict::Apply
            } else {
                ScaleVerdict::Fail
            };
            match (verdict, bad) {
                (ScaleVerdict::Skip, _) => {
                    self.trace.skipped_steps += 1;
                    return Ok(None);
                }
                (ScaleVerdict::Fail, Some(i)) => {
                    let mut f =
                        self.backward_failure(i, &scans[i], &grads[i], tracer, &grad_store)?;
                    if self.scaler.is_dynamic() {
                        f.kind = FindingKind::ScaleCollapse;
                        f.detail = format!(
                            "gradients kept overflowing: the loss scale fell to {} after {} skipped steps; {}",
                            self.scaler.scale, self.scaler.skipped, f.detail
                        );
                    }
                    return Ok(Some(Box::new(f)));
                }
                _ => {}
            }
            let sum_sq: Vec<f64> = scans.iter().map(|s| s.sum_sq).collect();
            norm = Some(optim::global_norm(&sum_sq) / scale);
        }
        if scale != 1.0 {
            for g in grads.iter_mut() {
                *g = (&*g * (1.0 / scale))?;
            }
        }
        if let Some(n) = norm {
            self.trace.grad_norms.push(n);
        }
        optim::clip(&self.case.clip, &mut grads, norm.unwrap_or(0.0))?;
        if fine {
            let refs: Vec<&Tensor> = grads.iter().collect();
            if let Some((i, s)) = scan_all(&refs)?
                .into_iter()
                .enumerate()
                .find(|(_, s)| !s.is_finite())
            {
                let mut f = self.tensor_failure(
                    &s,
                    Phase::Update,
                    "clip".into(),
                    format!(
                        "clipping made the gradient of `{}` non-finite",
                        self.names[i]
                    ),
                    &grads[i],
                )?;
                f.op = Some("clip".into());
                return Ok(Some(Box::new(f)));
            }
        }

        // Update.
        self.optimizer.step(&self.vars, &grads, lr)?;
        // Accelerator mode checks the update at the next step's copy.
        if self.probe && !fast {
            if let Some(f) = self.check_update()? {
                return Ok(Some(Box::new(f)));
            }
        }
        if !self.watch_divergence {
            return Ok(None);
        }
        if let Some(smoothed) = self.tracker.push(loss_value) {
            // A failed update comes before divergence, as on the CPU path
            // (an extra synchronization, only when the run is over anyway).
            if self.probe && fast {
                if let Some(f) = self.check_update()? {
                    return Ok(Some(Box::new(f)));
                }
            }
            return Ok(Some(Box::new(Failure::new(
                FindingKind::Divergence,
                Phase::Update,
                "loss_trend",
                format!(
                    "smoothed loss {smoothed:.4e} exceeds {} x the best {:.4e}",
                    self.case.divergence_factor,
                    self.tracker.best()
                ),
            ))));
        }
        Ok(None)
    }

    /// The loss is not finite: blame the first non-finite forward stage
    /// (traced), else the model output, else the loss itself.
    fn forward_failure(
        &self,
        output: &Tensor,
        logits: &Tensor,
        loss_value: f64,
        tracer: &Tracer,
    ) -> Result<Failure> {
        if let Some((i, scan)) = localize::first_forward(tracer.records())? {
            let r = &tracer.records()[i];
            let mut f = self.tensor_failure(
                &scan,
                Phase::Forward,
                r.name.clone(),
                format!(
                    "stage `{}` produced non-finite values from finite inputs",
                    r.name
                ),
                &r.output,
            )?;
            f.op = localize::op_of(&r.name);
            return Ok(f);
        }
        let out_scan = scan_all(&[output])?[0];
        if !out_scan.is_finite() {
            return self.tensor_failure(
                &out_scan,
                Phase::Forward,
                "output".into(),
                "the model output is not finite".into(),
                output,
            );
        }
        Ok(Failure {
            op: Some(self.case.loss.name().to_string()),
            stats: Some(TensorStats::of_tensor(logits)?),
            ..Failure::new(
                self.kind_of_value(loss_value),
                Phase::Loss,
                format!("loss.{}", self.case.loss.name()),
                format!("the loss is {loss_value} although the model output is finite"),
            )
        })
    }

    /// Gradient `i` is not finite: blame the stage whose backward produced
    /// it (traced), else the loss's backward, else the parameter's own gradient.
    fn backward_failure(
        &self,
        i: usize,
        scan: &TensorScan,
        grad: &Tensor,
        tracer: &Tracer,
        grad_store: &candle_core::backprop::GradStore,
    ) -> Result<Failure> {
        if tracer.enabled() {
            if let Some(p) = localize::first_backward(tracer.records(), grad_store)? {
                let (stage, op) = match &p.stage {
                    Some(s) => (s.clone(), localize::op_of(s)),
                    None => (
                        format!("loss.{}", self.case.loss.name()),
                        Some(self.case.loss.name().to_string()),
                    ),
                };
                let mut f = self.tensor_failure(
                    &p.scan,
                    Phase::Backward,
                    stage.clone(),
                    format!(
                        "the backward pass of `{stage}` made the gradient of `{}` non-finite",
                        p.receiver
                    ),
                    &p.grad,
                )?;
                f.op = op;
                return Ok(f);
            }
        }
        self.tensor_failure(
            scan,
            Phase::Backward,
            format!("grad.{}", self.names[i]),
            format!("the gradient of `{}` is not finite", self.names[i]),
            grad,
        )
    }

    /// Scans parameters and optimizer state after an update.
    /// What an update changes: the parameters, then the optimizer state.
    fn update_tensors(&self) -> Vec<&Tensor> {
        let mut tensors: Vec<&Tensor> = self.vars.iter().map(|v| v.as_tensor()).collect();
        tensors.extend(self.optimizer.state_tensors().map(|(_, _, t)| t));
        tensors
    }

    fn check_update(&self) -> Result<Option<Failure>> {
        let tensors = self.update_tensors();
        // Finiteness from the bits first; statistics only for a failure.
        let Some(i) = crate::probe::first_non_finite(&tensors)? else {
            return Ok(None);
        };
        let scan = scan_all(&[tensors[i]])?[0];
        Ok(Some(self.update_failure(i, &scan, tensors[i])?))
    }

    /// Tensor `i` of [`Self::update_tensors`] is not finite after the update.
    fn update_failure(&self, i: usize, scan: &TensorScan, tensor: &Tensor) -> Result<Failure> {
        let state: Vec<(usize, &'static str, &Tensor)> = self.optimizer.state_tensors().collect();
        let (stage, what) = if i < self.vars.len() {
            let name = &self.names[i];
            (format!("param.{name}"), format!("parameter `{name}`"))
        } else {
            let (p, kind, _) = state[i - self.vars.len()];
            let name = format!("{kind}.{}", self.names[p]);
            (
                format!("optimizer.{name}"),
                format!("optimizer state `{name}`"),
            )
        };
        self.tensor_failure(
            scan,
            Phase::Update,
            stage,
            format!("{what} is not finite after the update"),
            tensor,
        )
    }

    fn kind_of_value(&self, v: f64) -> FindingKind {
        if v.is_nan() {
            FindingKind::Nan
        } else if self.half {
            // In half precision an infinity is an overflow of the format.
            FindingKind::Overflow
        } else {
            FindingKind::Inf
        }
    }

    fn tensor_failure(
        &self,
        scan: &TensorScan,
        phase: Phase,
        stage: String,
        detail: String,
        t: &Tensor,
    ) -> Result<Failure> {
        let kind = if scan.nan > 0 {
            FindingKind::Nan
        } else {
            self.kind_of_value(f64::INFINITY)
        };
        Ok(Failure {
            stats: Some(TensorStats::of_tensor(t)?),
            ..Failure::new(
                kind,
                phase,
                stage,
                format!("{detail} ({} NaN, {} Inf)", scan.nan, scan.inf),
            )
        })
    }

    fn finding(&self, step: usize, f: Failure) -> Finding {
        let signature = Signature {
            kind: f.kind,
            phase: f.phase,
            stage: crate::outcome::stage_key(&f.stage),
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
            signature,
            trace,
        }
    }
}

#[cfg(test)]
mod tests;
