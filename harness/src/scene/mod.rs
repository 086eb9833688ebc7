//! The emergency brake: the scene of a step, one format for both drivers.
//!
//! A scene is a directory with `scene.json` (the step and its finding, the
//! last 20 losses, the gradient-norm history, the batch's and every saved
//! tensor's statistics, the optimizer, the tracker, the loss scaler, the
//! history before the step, the environment, the warnings) and
//! `scene.safetensors` (`param/<name>` and `optimizer/<kind>.<name>` from
//! before the step, the step's batch as `batch/<part>`, and what else the
//! driver needs to run the step again, such as the runner's
//! `source/<part>`), loadable by Python's `safetensors`. A run of a case
//! adds `case.json`: the case is optional, so the user's own loop (the
//! guard) writes the same format. It is written into a temporary sibling
//! directory and renamed into place, so a scene is complete or absent.
//!
//! [`SavedScene`] reads one back (and the runner's dumps of earlier
//! versions, `stats.json` and `state.safetensors`), checks that it is
//! whole, and judges a replay of its step.

mod saved;

pub use saved::SavedScene;

use crate::error::{Error, Result};
use crate::finding::{Finding, Trace};
use crate::probe::{DivergenceTracker, TensorStats};
use crate::scaler::LossScaler;
use crate::spec::{Case, OptimizerSpec};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The scene's JSON file.
pub const SCENE_FILE: &str = "scene.json";
/// The scene's tensors.
pub const SCENE_TENSORS: &str = "scene.safetensors";
/// The case of a run of a case.
pub const CASE_FILE: &str = "case.json";
/// How many of the most recent losses `scene.json` lists.
pub const RECENT_LOSSES: usize = 20;

/// `scene.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scene {
    /// The version that wrote it.
    pub nanhunt_version: String,
    /// The step of the scene; the saved state is from before it.
    pub step: usize,
    /// The step's finding; `None` for a healthy step dumped on request.
    pub finding: Option<Finding>,
    /// The last (up to 20) losses, the step's own included when it computed one.
    #[serde(with = "crate::floats::exact")]
    pub recent_losses: Vec<f64>,
    /// The gradient norms before the step.
    #[serde(with = "crate::floats::exact")]
    pub grad_norms: Vec<f64>,
    /// The batch's tensors in order, with their statistics.
    pub batch: Vec<BatchPart>,
    /// Mixup's or CutMix's λ for the step's batch (also the tensor
    /// `batch/mix_lambda`): the loss is λ·L(targets) + (1−λ)·L(mix_targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix_lambda: Option<f64>,
    /// Trainable variables, in the driver's order.
    pub vars: Vec<String>,
    /// What the scene records of the optimizer.
    pub optimizer: OptimizerRecord,
    /// The optimizer's variables by name, in its order (a user's optimizer
    /// may order them otherwise).
    #[serde(default)]
    pub optimizer_vars: Vec<String>,
    /// Statistics of every tensor in `scene.safetensors`.
    pub tensors: BTreeMap<String, TensorStats>,
    /// Tensors the driver's `include` left out.
    #[serde(default)]
    pub omitted: Vec<String>,
    /// The divergence tracker before the step.
    pub tracker: DivergenceTracker,
    /// The loss scaler before the step (a run of a case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaler: Option<LossScaler>,
    /// The run's history before the step.
    pub history: Trace,
    /// Where it ran.
    pub environment: Environment,
    /// Warnings given before the step (half-precision margins, jumps).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Whether two runs of the step's loss gave the same bits when the
    /// scene was written; `None`: not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deterministic: Option<bool>,
    /// The case `case.json`'s was cut from, where it was: a hunt's
    /// trigger runs one step of a shrunk batch; its repair is verified over
    /// the case the hunt searched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Case>,
}

/// One of the batch's tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchPart {
    /// The tensor's name (`inputs`, `targets`, …).
    pub name: String,
    /// Its dtype.
    pub dtype: String,
    /// Its statistics.
    pub stats: TensorStats,
}

/// What a scene records of the optimizer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OptimizerRecord {
    /// nanhunt's optimizer: its spec and step count; the moments are in
    /// `scene.safetensors` under `optimizer/`.
    Saved {
        /// The optimizer's spec.
        spec: OptimizerSpec,
        /// Steps it had taken.
        steps: usize,
    },
    /// An optimizer whose state cannot be read (candle-nn's): a replay
    /// starts it fresh.
    NotAvailable {
        /// The optimizer's name.
        name: String,
    },
}

/// Where the run happened (the article's step 5 starts here).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// The device.
    pub device: String,
    /// Whether CUDA was compiled in.
    pub cuda_compiled: bool,
    /// The operating system.
    pub os: String,
    /// The CPU architecture.
    pub arch: String,
    /// Cores available to the process.
    pub available_cores: usize,
    /// RAYON_NUM_THREADS, where set (candle's CPU thread count).
    pub rayon_num_threads: Option<String>,
    /// Resident and peak memory of this process, and the machine's memory, in KiB
    /// (from /proc where the OS has it).
    pub process_rss_kib: Option<u64>,
    /// The process's peak memory.
    pub process_peak_kib: Option<u64>,
    /// The machine's memory.
    pub machine_total_kib: Option<u64>,
    /// The machine's available memory.
    pub machine_available_kib: Option<u64>,
}

fn proc_field(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Environment {
    /// The environment of this process, running on `device`.
    pub fn collect(device: &str) -> Self {
        Environment {
            device: device.to_string(),
            cuda_compiled: crate::device::cuda_compiled(),
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            available_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            rayon_num_threads: std::env::var("RAYON_NUM_THREADS").ok(),
            process_rss_kib: proc_field("/proc/self/status", "VmRSS"),
            process_peak_kib: proc_field("/proc/self/status", "VmHWM"),
            machine_total_kib: proc_field("/proc/meminfo", "MemTotal"),
            machine_available_kib: proc_field("/proc/meminfo", "MemAvailable"),
        }
    }
}

/// What a driver hands over to write the scene of a step.
pub(crate) struct SceneParts<'a> {
    /// The run's case, when a case was run (`case.json`).
    pub case: Option<&'a Case>,
    /// The case that one was cut from, where it was (a hunt's trigger).
    pub origin: Option<&'a Case>,
    pub step: usize,
    pub finding: Option<&'a Finding>,
    /// The history through the step (its loss and gradient norm, where it
    /// computed them).
    pub trace: &'a Trace,
    /// The history before the step.
    pub history: Trace,
    /// The trainable variables and their values before the step, in order.
    pub vars: &'a [String],
    pub params: Vec<Tensor>,
    pub optimizer: OptimizerRecord,
    /// The optimizer's state, as `<kind>.<variable name>`.
    pub optimizer_state: Vec<(String, Tensor)>,
    pub optimizer_vars: Vec<String>,
    pub tracker: &'a DivergenceTracker,
    pub scaler: Option<&'a LossScaler>,
    /// The step's batch, by part.
    pub batch: Vec<(String, Tensor)>,
    /// More tensors the driver needs to run the step again, by full name.
    pub extra: Vec<(String, Tensor)>,
    pub mix_lambda: Option<f64>,
    /// Only tensors whose name starts with one of these are saved (empty: all).
    pub include: &'a [String],
    /// The device the step ran on.
    pub device: String,
    /// Whether two runs of the step's loss gave the same bits ([`same_bits`]).
    pub deterministic: Option<bool>,
}

/// Whether two runs of a step's computation gave the same bits: a model
/// that draws unseeded random numbers (candle's dropout, `randn_like`)
/// does not.
pub fn same_bits(a: &Tensor, b: &Tensor) -> Result<bool> {
    if a.dims() != b.dims() {
        return Ok(false);
    }
    let values = |t: &Tensor| -> Result<Vec<f64>> {
        Ok(t.flatten_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1()?)
    };
    let (a, b) = (values(a)?, values(b)?);
    Ok(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()))
}

/// Fails early when `dir` already exists, so that no scene overwrites anything.
pub fn ensure_free(dir: &Path) -> Result<()> {
    if dir.exists() {
        return Err(Error::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the dump directory already exists; choose another or remove it",
            ),
        ));
    }
    Ok(())
}

/// Writes the scene of a step to `dir` (which must not exist), atomically.
pub(crate) fn write(dir: &Path, s: &SceneParts) -> Result<()> {
    ensure_free(dir)?;
    let mut all: Vec<(String, Tensor)> = Vec::new();
    for (n, t) in s.vars.iter().zip(&s.params) {
        all.push((format!("param/{n}"), t.clone()));
    }
    for (n, t) in &s.optimizer_state {
        all.push((format!("optimizer/{n}"), t.clone()));
    }
    let mut batch = Vec::new();
    for (n, t) in &s.batch {
        batch.push(BatchPart {
            name: n.clone(),
            dtype: format!("{:?}", t.dtype()),
            stats: TensorStats::of_tensor(t)?,
        });
        all.push((format!("batch/{n}"), t.clone()));
    }
    all.extend(s.extra.iter().cloned());
    let (kept, omitted): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(n, _)| s.include.is_empty() || s.include.iter().any(|p| n.starts_with(p)));
    let mut tensors = BTreeMap::new();
    for (n, t) in &kept {
        tensors.insert(n.clone(), TensorStats::of_tensor(t)?);
    }
    let losses = &s.trace.losses;
    let scene = Scene {
        nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
        step: s.step,
        finding: s.finding.cloned(),
        recent_losses: losses[losses.len().saturating_sub(RECENT_LOSSES)..].to_vec(),
        grad_norms: s.trace.grad_norms.clone(),
        batch,
        mix_lambda: s.mix_lambda,
        vars: s.vars.to_vec(),
        optimizer: s.optimizer.clone(),
        optimizer_vars: s.optimizer_vars.clone(),
        tensors,
        omitted: omitted.into_iter().map(|(n, _)| n).collect(),
        tracker: s.tracker.clone(),
        scaler: s.scaler.cloned(),
        history: s.history.clone(),
        environment: Environment::collect(&s.device),
        warnings: s.history.warnings.iter().map(|w| w.to_string()).collect(),
        deterministic: s.deterministic,
        origin: s.origin.map(|c| c.with_paths_relative_to(dir)),
    };
    let map: HashMap<String, Tensor> = kept
        .into_iter()
        .map(|(n, t)| Ok((n, t.to_device(&Device::Cpu)?)))
        .collect::<Result<_>>()?;
    crate::files::write_dir_atomic(dir, |tmp| {
        if let Some(case) = s.case {
            let case = case.with_paths_relative_to(dir);
            crate::files::write_synced(&tmp.join(CASE_FILE), case.to_json().as_bytes())?;
        }
        save_tensors(&map, &tmp.join(SCENE_TENSORS))?;
        let json = serde_json::to_string_pretty(&scene).expect("a scene serializes");
        crate::files::write_synced(&tmp.join(SCENE_FILE), json.as_bytes())
    })
}

/// Saves tensors as safetensors and syncs the file.
pub fn save_tensors(map: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    candle_core::safetensors::save(map, path)?;
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(path, e))
}
