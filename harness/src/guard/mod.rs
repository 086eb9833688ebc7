//! nanhunt in the user's own training loop: the guard is the second driver
//! of the step engine. Each step of any candle loop goes through the same
//! checks as the runner's (`checks`: the batch, the loss, that
//! every trainable variable got a gradient, every gradient, the loss
//! trend, the update, the norms' jumps); the guard keeps what it needs to
//! undo the step (nanhunt's optimizers are checked before they set
//! anything), and on the first failure restores the state from before it,
//! re-runs the step with tracing on to name the first producer
//! (`localize`), builds the finding with the one constructor the
//! runner uses, writes the scene and stops the loop with a typed error.
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
//! guard.finish(&opt)?; // a finite explosion is judged over the whole loop
//! ```

mod jump;
mod kept;
mod optim;
mod options;
mod phases;
mod precision;
mod replay;
mod state;
mod stop;

/// The scene a guard writes: the one scene format ([`crate::scene`]).
pub use crate::scene::{Scene as GuardScene, SCENE_FILE, SCENE_TENSORS};
pub use optim::{GuardOptimizer, NanhuntOptimizer, OptimizerRecord, SavedOptimizer};
pub use options::{GuardOptions, LossFn, Rebuild, Rebuilt};
pub use replay::{replay, GuardReplay};
pub(crate) use replay::{replay_changed, train_changed, Changes};

/// A half-precision gradient within this factor of its dtype's largest
/// value is warned about (the shared check's margin).
pub use crate::checks::HALF_MARGIN;

use crate::checks::explosion::JumpWatch;
use crate::error::Error;
use crate::finding::{Finding, FindingKind, StageKeys, Subject, Trace, Warning};
use crate::probe::DivergenceTracker;
use crate::spec::{DeviceSpec, OptimizerSpec, PrecisionKind};
use candle_core::{DType, Result as CandleResult, Tensor, Var};
use std::path::PathBuf;

/// A step's batch: named tensors, in order.
#[derive(Clone, Debug)]
pub struct Batch {
    parts: Vec<(String, Tensor)>,
}

impl Batch {
    /// A batch of named tensors (`x`, `y`, …), in the order given.
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

    /// The named tensors, in order.
    pub fn parts(&self) -> &[(String, Tensor)] {
        &self.parts
    }

    /// The batch's tensors, in order.
    pub fn tensors(&self) -> Vec<&Tensor> {
        self.parts.iter().map(|(_, t)| t).collect()
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
        /// The finding.
        finding: Box<Finding>,
        /// Where its scene was written, if it was.
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
    /// The finding, when the step failed.
    pub fn finding(&self) -> Option<&Finding> {
        match self {
            GuardError::Unstable { finding, .. } => Some(finding),
            GuardError::Invalid(_) => None,
        }
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
    /// The explosion rule's running norms, as in the runner.
    watch: JumpWatch,
    /// The parameters' global norm when the guard was made.
    init_norm: f64,
    /// The loop's first jump and the step whose loss crossed the
    /// divergence line, each with the state before its step, until judged.
    pending: crate::checks::pending::Pending<kept::Saved>,
    /// Non-trainable state a forward pass may change (batch-norm running
    /// statistics in training mode): restored with the step.
    buffers: Vec<Var>,
    /// A stage guarded every step (diagnose's interventions on a scene).
    intervention: Option<std::sync::Arc<crate::intervention::Intervention>>,
}

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
            crate::scene::ensure_free(dir)?;
        }
        if !(opts.divergence_factor > 1.0 && opts.divergence_factor.is_finite()) {
            return Err(Error::option(
                "divergence_factor",
                format!("must be finite and above 1, got {}", opts.divergence_factor),
            ));
        }
        let (names, vars): (Vec<String>, Vec<Var>) = named.into_iter().unzip();
        let tensors: Vec<&Tensor> = vars.iter().map(|v| v.as_tensor()).collect();
        let init_norm = crate::probe::global_norm(&crate::probe::scan_all(&tensors)?);
        Ok(Guard {
            names,
            vars,
            tracker: DivergenceTracker::new(opts.divergence_factor),
            opts,
            trace: Trace::default(),
            layout: None,
            watch: JumpWatch::new(init_norm),
            init_norm,
            pending: Default::default(),
            buffers: Vec::new(),
            intervention: None,
        })
    }

    /// The variables in the guard's order.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// The variables' names, in the guard's order.
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
    /// overflowing, and norms that jumped (the run goes on; these say how
    /// close it came).
    pub fn warnings(&self) -> &[Warning] {
        &self.trace.warnings
    }

    /// What the loop is, for its findings' signatures: the guard's name,
    /// `opt`'s name, the variables' dtype and device.
    pub fn subject(&self, opt: &(impl GuardOptimizer + ?Sized)) -> Subject {
        let var = &self.vars[0];
        Subject {
            family: self.opts.name.clone(),
            optimizer: opt.name(),
            precision: PrecisionKind::of_dtype(var.dtype()),
            device: match var.device().location() {
                candle_core::DeviceLocation::Cuda { gpu_id } => DeviceSpec::Cuda(gpu_id),
                _ => DeviceSpec::Cpu,
            },
            keys: StageKeys::User,
        }
    }

    /// The tracer a step's loss runs under: the intervention's stage
    /// guarded, recording when `on` (a traced re-run).
    fn tracer(&self, on: bool) -> crate::models::Tracer {
        let t = if on {
            crate::models::Tracer::on()
        } else {
            crate::models::Tracer::off()
        };
        t.with_intervention(self.intervention.clone())
    }

    /// Whether the loop computes in a half-precision format.
    fn half(&self) -> bool {
        matches!(self.vars[0].dtype(), DType::F16 | DType::BF16)
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
        // A seeded dropout draws the same masks whenever the loss is run
        // again for this step (localization, the scene's check, a replay).
        let mut loss_of = |b: &Batch| crate::models::seeded::at_step(step as u64, || loss_of(b));
        self.check_layout(batch)?;
        let mut before = self.save(opt)?;
        let failure = match self.checked_step(step, batch, opt, &mut loss_of, &before)? {
            Ok(loss) => return Ok(loss),
            Err(failure) => failure,
        };
        // A failed step committed no update: the optimizer's state is still
        // the one before it.
        before.settle(opt);
        // Judged after the step that crossed: that step's finding.
        let crossed = match failure.kind {
            FindingKind::Divergence => self.pending.take_crossing(),
            _ => None,
        };
        if let Some(kept) = crossed {
            self.restore(&before, opt)?;
            return Err(self.judged(kept, failure, opt));
        }
        Err(self.stop(step, failure, &before, opt, batch, &mut loss_of))
    }

    /// Like [`Guard::step`], with the model's forward pass and the loss
    /// as two closures: the guard records the forward's output as stage
    /// `output`, so a NaN the model produced is a forward finding and one
    /// the loss produced a loss finding, with no `trace` call in the model.
    pub fn step_with_output<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        batch: &Batch,
        opt: &mut O,
        mut forward: impl FnMut(&Batch) -> CandleResult<Tensor>,
        mut loss: impl FnMut(&Tensor, &Batch) -> CandleResult<Tensor>,
    ) -> std::result::Result<f64, GuardError> {
        self.step(step, batch, opt, |b| {
            let output = crate::trace::trace("output", forward(b)?)?;
            loss(&output, b)
        })
    }

    /// The batch keeps its names, dtypes and per-sample dims from step to step.
    fn check_layout(&mut self, batch: &Batch) -> std::result::Result<(), GuardError> {
        // The common case, the same layout again, allocates nothing.
        if let Some(first) = &self.layout {
            let same = first.len() == batch.parts.len()
                && first
                    .iter()
                    .zip(&batch.parts)
                    .all(|((n, d, s), (name, t))| {
                        n == name && *d == t.dtype() && t.dims().get(1..) == Some(&s[..])
                    });
            if same {
                return Ok(());
            }
        }
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
}
