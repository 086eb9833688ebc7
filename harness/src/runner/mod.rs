//! The runner's driver of the step engine: a [`Session`] trains a `Case`
//! step by step — batch → pathologies → augment → forward → loss →
//! backward → clip → update — with the shared checks (`checks`)
//! after every stage that can produce a non-finite value, and re-runs a
//! failing step with tracing on to name its first producer. A whole run
//! (to the end, with its precision check and dump) is `training` ([`crate::run_model`]).

use crate::device;
use crate::error::{Error, Result};
use crate::finding::{Finding, FindingKind, Phase, Subject, Trace};
use crate::localize;
use crate::losses::UserLoss;
use crate::models::{ModelFactory, ParamStore, Tracer};
use crate::optim::{self, Optimizer, UpdateScans};
use crate::probe::{scan_all, DivergenceTracker};
use crate::scaler::LossScaler;
use crate::spec::{Case, Limits};
pub use crate::state::Snapshot;
use candle_core::{DType, Device, Tensor, Var};

mod batch;
mod crossing;
mod fit;
mod jumps;
mod naming;
mod options;
mod step;

pub use crate::finding::Failure;
pub use batch::Forward;
pub use options::RunOptions;

use crate::checks::explosion::JumpWatch;
use crate::data::DataSource;
use jumps::StepSeen;
use naming::Namer;
use step::{Failed, Readback};

/// A training run in progress.
pub struct Session<'a> {
    case: Case,
    /// What the run is, for its signatures.
    subject: Subject,
    device: Device,
    factory: &'a dyn ModelFactory,
    params: ParamStore,
    vars: Vec<Var>,
    names: Vec<String>,
    optimizer: Optimizer,
    /// Where an update checked before it is accepted is computed: after
    /// it is accepted, the state before it (see
    /// [`Optimizer::update_checked_from`]).
    staging: Optimizer,
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
    /// The explosion rule's running norms (O(1) per step; rebuilt from the
    /// history when it is restored).
    watch: JumpWatch,
    /// The run's first jump (see [`crate::checks::explosion`]) and the
    /// step whose loss crossed the divergence line, each with the state
    /// before its step, until judged.
    pending: crate::checks::pending::Pending<Option<Snapshot>>,
    /// The stage guarded every step, if any.
    intervention: Option<std::sync::Arc<crate::intervention::Intervention>>,
    /// Check the first step's gradients along random directions.
    check_gradients: bool,
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
        let registered = crate::models::registered_for(&case).and_then(|m| m.dataset.clone());
        let dataset = opts.dataset.clone().or(registered);
        let source = crate::data::open_source(&case, dataset.as_ref(), max)?;
        let session = Session::build(case, factory, opts, source)?;
        fit::check(&session)?;
        Ok(session)
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
        // A registered model brings its own loss closure.
        let user_loss = opts
            .loss
            .clone()
            .or_else(|| crate::models::registered_for(&case).and_then(|m| m.loss.clone()));
        if let (crate::spec::LossSpec::Custom { name, .. }, None) = (&case.loss, &user_loss) {
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
        let (names, vars) = trainable(&params, &case, &opts.limits)?;
        let compute = precision.compute_dtype();
        let init_norm = crate::probe::global_norm(&scan_all(
            &vars.iter().map(|v| v.as_tensor()).collect::<Vec<_>>(),
        )?);
        Ok(Session {
            subject: Subject::of_case(&case),
            init_norm,
            grad_sq: Vec::new(),
            watch: JumpWatch::new(init_norm),
            pending: Default::default(),
            intervention: opts.intervention.clone(),
            optimizer: Optimizer::new(&case.optimizer, vars.len()),
            staging: Optimizer::new(&case.optimizer, vars.len()),
            scaler: LossScaler::new(precision.loss_scaling()),
            source,
            tracker: DivergenceTracker::new(case.divergence_factor),
            trace: Trace::default(),
            probe: opts.probe,
            watch_divergence: opts.watch_divergence,
            check_gradients: opts.check_gradients,
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
            user_loss,
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

    /// The case it runs.
    pub fn case(&self) -> &Case {
        &self.case
    }

    /// The parameters.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// The history so far.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// The history, the session ended.
    pub fn into_trace(mut self) -> Trace {
        if self.case.precision.loss_scaling().is_some() {
            self.trace.loss_scale = Some(self.scaler.scale);
        }
        self.trace
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
        let case = &self.case;
        let lr = optim::lr_at(&case.schedule, case.optimizer.lr(), step, case.steps);
        let before = self.probe.then(|| self.snapshot()).transpose()?;
        let seen = (
            self.trace.grad_norms.len(),
            self.trace.param_norms.len(),
            self.trace.mark(),
        );
        let mut tracer = Tracer::off().with_intervention(self.intervention.clone());
        // A guarded stage is reached from any depth of the user's code too.
        let shared = tracer
            .active()
            .then(|| crate::models::tracer::share(&tracer));
        let inner = self.step_inner(step, lr, &mut tracer, false);
        drop(shared);
        let failure = match inner? {
            None => return self.healthy(step, lr, before, seen).map(|()| None),
            Some(Failed::ThisStep(failure)) => failure,
            // The previous step's update failed; this step's copy saw it.
            Some(Failed::PreviousUpdate(failure)) => return self.previous_update_failed(*failure),
        };
        // A divergence judged after the step that crossed is that step's.
        if failure.kind == FindingKind::Divergence && self.crossing_step().is_some_and(|s| s < step)
        {
            return Ok(self.judged_crossing(*failure));
        }
        let failure = match before {
            Some(snapshot) => self.localized(step, lr, snapshot, &failure)?,
            None => *failure,
        };
        Ok(Some(self.finding(step, failure)))
    }

    /// After a healthy step: the jump check, and (deferred readback) the
    /// state before it kept until the next step's copy checks its update.
    /// `seen` are the norms' counts and the history's mark before the step.
    fn healthy(
        &mut self,
        step: usize,
        lr: f64,
        before: Option<Snapshot>,
        (grad_norms, param_norms, mark): (usize, usize, crate::finding::TraceMark),
    ) -> Result<()> {
        let previous = match self.readback {
            Readback::Deferred => self.unchecked.take().map(|p| p.2),
            Readback::InPlace => None,
        };
        let seen = StepSeen {
            grad_norms,
            param_norms,
            mark,
            before: before.as_ref(),
            previous,
        };
        self.watch_jumps(step, seen)?;
        self.watch_crossing(step, before.as_ref())?;
        if self.readback == Readback::Deferred {
            self.unchecked = before.map(|b| (step, lr, b));
        }
        Ok(())
    }

    /// Deferred readback saw the previous step's update fail: the finding
    /// of that step, localized from the state before it.
    fn previous_update_failed(&mut self, failure: Failure) -> Result<Option<Finding>> {
        let (prev, prev_lr, prev_before) = self
            .unchecked
            .take()
            .expect("a deferred check follows a completed step");
        let localized = self.localized(prev, prev_lr, prev_before, &failure)?;
        Ok(Some(self.finding(prev, localized)))
    }

    /// `first` localized by a traced re-run of `step` from `before`, which
    /// is kept as the failed step's state.
    fn localized(
        &mut self,
        step: usize,
        lr: f64,
        before: Snapshot,
        first: &Failure,
    ) -> Result<Failure> {
        let localized = self.localize(step, lr, &before, first)?;
        self.failed_before = Some(before);
        Ok(localized)
    }

    /// Ends a run: in accelerator mode the last step's update has not been
    /// checked yet (one more synchronization). Returns its finding, if any.
    pub fn finish(&mut self) -> Result<Option<Finding>> {
        let Some((step, lr, before)) = self.unchecked.take() else {
            return Ok(None);
        };
        self.syncs += 1;
        let Some(failure) = self.check_update(None)? else {
            return Ok(None);
        };
        let localized = self.localized(step, lr, before, &failure)?;
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
        self.watch = self.watch_after_history();
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
        self.watch = self.watch_after_history();
        Ok(())
    }

    /// Writes the crash dump of the step that failed.
    pub fn write_dump(&self, dir: &std::path::Path, finding: &Finding) -> Result<()> {
        self.write_failed(dir, finding, None)
    }

    /// Writes the crash dump of the step that failed, recording `origin`:
    /// the case this run's was cut from (a hunt's trigger: its batch
    /// shrunk, its steps cut), which a diagnosis verifies over.
    pub fn write_dump_from(
        &self,
        dir: &std::path::Path,
        finding: &Finding,
        origin: &Case,
    ) -> Result<()> {
        self.write_failed(dir, finding, Some(origin))
    }

    fn write_failed(
        &self,
        dir: &std::path::Path,
        finding: &Finding,
        origin: Option<&Case>,
    ) -> Result<()> {
        let before = self.failed_before.as_ref().ok_or_else(|| {
            Error::invalid(
                "dump",
                "the run has no failed step to dump (was the probe on?)",
            )
        })?;
        self.write_scene(dir, finding.step, before, Some(finding), origin)
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
        self.write_scene(dir, step, before, finding, None)
    }

    fn write_scene(
        &self,
        dir: &std::path::Path,
        step: usize,
        before: &Snapshot,
        finding: Option<&Finding>,
        origin: Option<&Case>,
    ) -> Result<()> {
        let trace = finding.map_or(&self.trace, |f| &f.trace);
        let batch = self.batch_unchecked(step)?;
        let names = &self.names;
        crate::scene::write(
            dir,
            &crate::scene::SceneParts {
                case: Some(&self.case),
                origin,
                step,
                finding,
                trace,
                history: trace.upto(before.history),
                vars: names,
                params: before.params.clone(),
                optimizer: crate::scene::OptimizerRecord::Saved {
                    spec: self.case.optimizer.clone(),
                    steps: before.optimizer.steps(),
                },
                optimizer_state: before.optimizer.state(names),
                optimizer_vars: names.clone(),
                tracker: &before.tracker,
                scaler: Some(&before.scaler),
                mix_lambda: batch.mix.as_ref().map(|(lambda, _)| *lambda),
                // The dataset indices go with the source's batch only.
                batch: batch::tensors(&batch)?
                    .into_iter()
                    .filter(|(n, _)| n != "samples")
                    .collect(),
                extra: batch::tensors(&self.raw_batch(step)?)?
                    .into_iter()
                    .filter(|(n, _)| !n.starts_with("mix_"))
                    .map(|(n, t)| (format!("source/{n}"), t))
                    .collect(),
                include: &[],
                device: self.case.device.to_string(),
                deterministic: self.deterministic(step, &batch),
            },
        )
    }

    /// Whether two forward passes of `step` on `batch` give the same
    /// outputs' bits (a seeded dropout does, candle's does not); `None`
    /// when the forward pass fails.
    fn deterministic(&self, step: usize, batch: &crate::data::HostBatch) -> Option<bool> {
        let run = || {
            crate::models::seeded::at_step(step as u64, || {
                self.forward_loss(batch, &mut Tracer::off())
            })
        };
        let (a, b) = (run().ok()?, run().ok()?);
        crate::scene::same_bits(&a.output, &b.output).ok()
    }

    /// The state before the step that failed (after `step` returned a finding).
    pub fn failed_before(&self) -> Option<&Snapshot> {
        self.failed_before.as_ref()
    }

    /// Keeps `before` as the failed step's state when the step kept none
    /// (without the probe, only a caller's snapshot holds it).
    pub fn keep_failed_before(&mut self, before: Option<Snapshot>) {
        if self.failed_before.is_none() {
            self.failed_before = before;
        }
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
        let shared = crate::models::tracer::share(&tracer);
        // A traced re-run reads values in place: its failure is this step's.
        let traced = self.step_inner(step, lr, &mut tracer, true);
        drop(shared);
        let traced = traced?;
        self.restore(&after)?;
        self.trace = history;
        let traced = match traced.map(Failed::into_failure) {
            Some(f) if f.phase == Phase::Update => {
                let records = tracer.records();
                // The failing tensor as the traced step left it (`after`).
                let failed = self.updated_tensor(&f.stage).cloned();
                let at = (tracer.update_from(), failed.as_ref());
                Some(Box::new(localize::at_update_op(*f, &records, at)?))
            }
            other => other,
        };
        Ok(match traced {
            Some(f) => *f,
            None => Failure {
                detail: format!("{} (not reproduced under tracing)", first.detail),
                ..first.clone()
            },
        })
    }

    /// The parameter or optimizer state an update failure's stage names
    /// (`param.<name>`, `optimizer.<kind>.<name>`).
    fn updated_tensor(&self, stage: &str) -> Option<&Tensor> {
        if let Some(name) = stage.strip_prefix("param.") {
            let i = self.names.iter().position(|n| n == name)?;
            return Some(self.vars[i].as_tensor());
        }
        let (kind, name) = stage.strip_prefix("optimizer.")?.split_once('.')?;
        self.optimizer
            .state_tensors()
            .find(|(p, k, _)| *k == kind && self.names[*p] == name)
            .map(|(_, _, t)| t)
    }

    /// What an update changes: the parameters, then the optimizer state.
    fn update_tensors(&self) -> Vec<&Tensor> {
        let mut tensors: Vec<&Tensor> = self.vars.iter().map(|v| v.as_tensor()).collect();
        tensors.extend(self.optimizer.state_tensors().map(|(_, _, t)| t));
        tensors
    }

    /// Scans parameters (whose norm goes into the trace) and optimizer
    /// state after an update.
    /// `seen`: what the optimizer's own pass saw of the values it wrote,
    /// where it saw them (then nothing is scanned again).
    fn check_update(&mut self, seen: Option<UpdateScans>) -> Result<Option<Failure>> {
        let tensors = self.update_tensors();
        let n = self.vars.len();
        let (params, bad) = match seen {
            Some(seen) => {
                let bad = seen.params.iter().position(|s| !s.is_finite());
                (seen.params, bad.or(seen.bad_state.map(|i| n + i)))
            }
            None => {
                let params = scan_all(&tensors[..n])?;
                // The optimizer state's finiteness from the bits; its
                // statistics only for a failure.
                let bad = match params.iter().position(|s| !s.is_finite()) {
                    Some(i) => Some(i),
                    None => crate::probe::first_non_finite(&tensors[n..])?.map(|i| n + i),
                };
                (params, bad)
            }
        };
        let Some(i) = bad else {
            let norm = crate::probe::global_norm(&params);
            self.trace.param_norms.push(norm);
            return Ok(None);
        };
        let scan = scan_all(&[tensors[i]])?[0];
        Ok(Some(self.namer().update_failure(i, &scan, tensors[i])?))
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

    /// The finding of a failure at `step`: the one constructor, with this
    /// run's subject and history.
    fn finding(&self, step: usize, f: Failure) -> Finding {
        let mut trace = self.trace.clone();
        if self.case.precision.loss_scaling().is_some() {
            trace.loss_scale = Some(self.scaler.scale);
        }
        Finding::new(step, f, &self.subject, trace)
    }
}

/// The trainable variables of a built model (those the case declares
/// frozen left out), within the case's parameter limit.
fn trainable(params: &ParamStore, case: &Case, limits: &Limits) -> Result<(Vec<String>, Vec<Var>)> {
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
    if count > limits.max_params {
        return Err(Error::invalid(
            "model",
            format!(
                "{count} parameters exceed the limit of {}",
                limits.max_params
            ),
        ));
    }
    Ok(trainable.into_iter().unzip())
}

#[cfg(test)]
mod tests;
