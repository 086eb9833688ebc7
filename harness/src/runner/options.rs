//! How to run a case: the options every driver of whole runs passes down.

use crate::data::Dataset;
use crate::intervention::Intervention;
use crate::losses::UserLoss;
use crate::spec::{DeviceSpec, Limits};
use std::path::PathBuf;
use std::sync::Arc;

/// How to run a case. Built from `RunOptions::default()` and the
/// builder methods below (fields may be added: the struct is
/// `#[non_exhaustive]`), or by setting its public fields.
#[derive(Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// Scan gradients, parameters, optimizer state and batches every step.
    /// Off, only the loss is watched (for measuring the probe's cost).
    pub probe: bool,
    /// Run on this device instead of the case's.
    pub device: Option<DeviceSpec>,
    /// The case limits it runs under.
    pub limits: Limits,
    /// Write a crash dump of the first failure here (the directory must not exist).
    pub dump: Option<PathBuf>,
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
    pub dataset: Option<Arc<dyn Dataset>>,
    /// The loss of a case whose `loss` is `custom` (the caller's closure).
    pub loss: Option<Arc<dyn UserLoss>>,
    /// Guard one recorded stage of the model every step ([`crate::intervention`]).
    pub intervention: Option<Arc<Intervention>>,
    /// At the first step, compare each trainable tensor's gradient along a
    /// seeded random direction with the loss's central difference along it
    /// (`run --check-gradients`): a present but wrong gradient is a
    /// `wrong_gradient` finding naming the tensor. Costs four extra forward
    /// passes per tensor, once; f32 and f64 runs only (half-precision
    /// differences are noise).
    pub check_gradients: bool,
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
            .field("check_gradients", &self.check_gradients)
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
            check_gradients: false,
        }
    }
}

impl RunOptions {
    /// Writes a crash dump of the first failure to `dir`.
    pub fn dump_to(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dump = Some(dir.into());
        self
    }

    /// With a dump directory: dumps step `step`'s scene, failing or not.
    pub fn dump_at(mut self, step: usize) -> Self {
        self.dump_at = Some(step);
        self
    }

    /// Runs on `device` instead of the case's.
    pub fn on(mut self, device: DeviceSpec) -> Self {
        self.device = Some(device);
        self
    }

    /// With these case limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The precision check of findings on (the default) or off.
    pub fn with_fidelity(mut self, on: bool) -> Self {
        self.fidelity = on;
        self
    }

    /// The probe on (the default) or off (only the loss is watched).
    pub fn with_probe(mut self, on: bool) -> Self {
        self.probe = on;
        self
    }

    /// The dataset of a case whose `data.source` is `user`.
    pub fn with_dataset(mut self, dataset: Arc<dyn Dataset>) -> Self {
        self.dataset = Some(dataset);
        self
    }

    /// The loss of a case whose `loss` is `custom`.
    pub fn with_loss(mut self, loss: Arc<dyn UserLoss>) -> Self {
        self.loss = Some(loss);
        self
    }

    /// Probes as on an accelerator (one copy per step) even on the CPU.
    pub fn with_accelerator_probe(mut self, on: bool) -> Self {
        self.accelerator_probe = on;
        self
    }

    /// Divergence ends a run (the default), or only non-finite values do.
    pub fn with_watch_divergence(mut self, on: bool) -> Self {
        self.watch_divergence = on;
        self
    }

    /// The first step's directional gradient check on or off (the default).
    pub fn with_gradient_check(mut self, on: bool) -> Self {
        self.check_gradients = on;
        self
    }

    /// Guards one recorded stage of the model every step.
    pub fn with_intervention(mut self, intervention: Intervention) -> Self {
        self.intervention = Some(Arc::new(intervention));
        self
    }
}
