//! The emergency brake: a crash dump of the scene at the first failure, or
//! of any step asked for (`--dump-at`), failing or healthy.
//!
//! A dump is a directory with `case.json`, `state.safetensors` (parameters
//! and optimizer state from before the dumped step, and that step's batch
//! after augmentation, with every random draw the step's augmentation made)
//! and `stats.json` (per-tensor statistics, the last 20 losses, the
//! gradient-norm history, the step and its finding if it failed, device and
//! memory information, and the counters needed to resume exactly). It is written
//! into a temporary sibling directory and renamed into place, so a dump is
//! either complete or absent.

use crate::data::{HostBatch, HostInput};
use crate::error::{Document, Error, Result};
use crate::finding::{Finding, Trace};
use crate::probe::{DivergenceTracker, TensorStats};
use crate::scaler::LossScaler;
use crate::spec::Case;
use crate::state::Snapshot;
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub const CASE_FILE: &str = "case.json";
pub const STATE_FILE: &str = "state.safetensors";
pub const STATS_FILE: &str = "stats.json";
/// How many of the most recent losses `stats.json` lists.
pub const RECENT_LOSSES: usize = 20;

/// `stats.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DumpStats {
    pub nanhunt_version: String,
    /// The 0-based step dumped; the saved state is from before it.
    pub step: usize,
    /// The step's finding; `None` for a healthy step dumped on request.
    pub finding: Option<Finding>,
    /// Mixup's or CutMix's λ for the step's batch (also the tensor
    /// `batch/mix_lambda`): the loss is λ·L(targets) + (1−λ)·L(mix_targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix_lambda: Option<f64>,
    /// The last (up to 20) losses, the dumped step's included.
    #[serde(with = "crate::floats::vec")]
    pub recent_losses: Vec<f64>,
    #[serde(with = "crate::floats::vec")]
    pub grad_norms: Vec<f64>,
    /// Statistics of every tensor in `state.safetensors`, by name.
    pub tensors: BTreeMap<String, TensorStats>,
    pub environment: Environment,
    /// Counters that, with the tensors, restore the session exactly.
    pub resume: Resume,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resume {
    pub optimizer_steps: usize,
    pub scaler: LossScaler,
    pub tracker: DivergenceTracker,
    /// The history before the failing step.
    pub trace: Trace,
}

/// Where the run happened (the article's step 5 starts here).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub device: String,
    pub cuda_compiled: bool,
    pub os: String,
    pub arch: String,
    pub available_cores: usize,
    /// RAYON_NUM_THREADS, where set (candle's CPU thread count).
    pub rayon_num_threads: Option<String>,
    /// Resident and peak memory of this process, and the machine's memory, in KiB
    /// (from /proc where the OS has it).
    pub process_rss_kib: Option<u64>,
    pub process_peak_kib: Option<u64>,
    pub machine_total_kib: Option<u64>,
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

/// Fails early when `dir` already exists, so that no dump overwrites anything.
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

/// What a dump saves: the scene of one step.
pub struct Scene<'a> {
    pub case: &'a Case,
    /// Parameter names in creation order.
    pub names: &'a [String],
    /// The dumped step.
    pub step: usize,
    /// The state before the step.
    pub before: &'a Snapshot,
    /// The run's history with the step (its loss and gradient norm).
    pub trace: &'a Trace,
    /// The step's batch after augmentation.
    pub batch: HostBatch,
    /// The same batch as its source made it (before pathologies and
    /// augmentation): what a replay feeds the step again.
    pub raw: HostBatch,
    /// The step's finding, if it failed.
    pub finding: Option<&'a Finding>,
}

/// The tensors of a dump, by name: `param/<name>`, `optimizer/<kind>.<name>`,
/// `batch/inputs`, `batch/targets`, `batch/labels`, `batch/mix_targets` and
/// `batch/mix_lambda` (a mixed batch's second targets and its λ, one f64),
/// and the source's batch: `source/inputs`, `source/targets`,
/// `source/labels`, `source/samples` (dataset indices, for batches drawn
/// from a dataset).
fn tensors(scene: &Scene) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for (name, t) in scene.names.iter().zip(&scene.before.params) {
        out.push((format!("param/{name}"), t.clone()));
    }
    for (name, t) in scene.before.optimizer.state(scene.names) {
        out.push((format!("optimizer/{name}"), t));
    }
    let batch = &scene.batch;
    let cpu = Device::Cpu;
    let input = match &batch.input {
        HostInput::Real { values, dims } => Tensor::from_slice(values, dims.as_slice(), &cpu)?,
        HostInput::Tokens { ids, dims } => Tensor::from_slice(ids, dims.as_slice(), &cpu)?,
    };
    out.push(("batch/inputs".into(), input));
    let shape = (batch.rows(), batch.classes);
    out.push((
        "batch/targets".into(),
        Tensor::from_slice(&batch.targets, shape, &cpu)?,
    ));
    out.push((
        "batch/labels".into(),
        Tensor::from_slice(&batch.labels, batch.rows(), &cpu)?,
    ));
    if let Some((lambda, t2)) = &batch.mix {
        out.push((
            "batch/mix_targets".into(),
            Tensor::from_slice(t2, shape, &cpu)?,
        ));
        out.push((
            "batch/mix_lambda".into(),
            Tensor::from_slice(&[*lambda], 1, &cpu)?,
        ));
    }
    let raw = &scene.raw;
    let input = match &raw.input {
        HostInput::Real { values, dims } => Tensor::from_slice(values, dims.as_slice(), &cpu)?,
        HostInput::Tokens { ids, dims } => Tensor::from_slice(ids, dims.as_slice(), &cpu)?,
    };
    out.push(("source/inputs".into(), input));
    out.push((
        "source/targets".into(),
        Tensor::from_slice(&raw.targets, (raw.rows(), raw.classes), &cpu)?,
    ));
    out.push((
        "source/labels".into(),
        Tensor::from_slice(&raw.labels, raw.rows(), &cpu)?,
    ));
    if !raw.samples.is_empty() {
        let samples: Vec<i64> = raw.samples.iter().map(|&s| s as i64).collect();
        out.push((
            "source/samples".into(),
            Tensor::from_slice(&samples, samples.len(), &cpu)?,
        ));
    }
    Ok(out)
}

use crate::files::write_synced as write_file;

/// Writes the dump of a step to `dir` (which must not exist).
pub fn write(dir: &Path, scene: &Scene) -> Result<()> {
    ensure_free(dir)?;
    let (case, before, trace) = (scene.case, scene.before, scene.trace);
    let named = tensors(scene)?;
    let mut stats = BTreeMap::new();
    for (name, t) in &named {
        let float = t.to_dtype(candle_core::DType::F64)?;
        stats.insert(name.clone(), TensorStats::of_tensor(&float)?);
    }
    let losses = &trace.losses;
    let dump_stats = DumpStats {
        nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
        step: scene.step,
        finding: scene.finding.cloned(),
        mix_lambda: scene.batch.mix.as_ref().map(|(lambda, _)| *lambda),
        recent_losses: losses[losses.len().saturating_sub(RECENT_LOSSES)..].to_vec(),
        grad_norms: trace.grad_norms.clone(),
        tensors: stats,
        environment: Environment::collect(&case.device.to_string()),
        resume: Resume {
            optimizer_steps: before.optimizer.steps(),
            scaler: before.scaler.clone(),
            tracker: before.tracker.clone(),
            trace: trace.upto(before.history),
        },
    };

    crate::files::write_dir_atomic(dir, |tmp| {
        let case = case.with_paths_relative_to(dir);
        write_file(&tmp.join(CASE_FILE), case.to_json().as_bytes())?;
        let map: HashMap<String, Tensor> = named
            .into_iter()
            .map(|(n, t)| Ok((n, t.to_device(&Device::Cpu)?)))
            .collect::<Result<_>>()?;
        save_tensors(&map, &tmp.join(STATE_FILE))?;
        let json = serde_json::to_string_pretty(&dump_stats).expect("dump stats serialize");
        write_file(&tmp.join(STATS_FILE), json.as_bytes())
    })
}

/// Saves tensors as safetensors and syncs the file.
pub fn save_tensors(map: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    candle_core::safetensors::save(map, path)?;
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(path, e))
}

/// A dump read back from disk.
pub struct Dump {
    pub dir: PathBuf,
    pub case: Case,
    pub stats: DumpStats,
    pub tensors: HashMap<String, Tensor>,
}

impl Dump {
    /// Reads a dump and checks that it is whole: the failing step lies
    /// within the case, and `state.safetensors` holds exactly the tensors
    /// that `stats.json` lists. Errors name the file and the tensor.
    pub fn load(dir: &Path, device: &Device) -> Result<Dump> {
        let malformed =
            |path: &Path, reason: String| Error::malformed(Document::Dump, path, reason);
        let case_path = dir.join(CASE_FILE);
        let mut case = Case::from_json(&crate::files::read_text(&case_path)?)
            .map_err(|e| malformed(&case_path, e.to_string()))?;
        case.resolve_paths(dir);
        let stats_path = dir.join(STATS_FILE);
        let stats: DumpStats = serde_json::from_str(&crate::files::read_text(&stats_path)?)
            .map_err(|e| malformed(&stats_path, e.to_string()))?;
        if stats.step >= case.steps || stats.resume.optimizer_steps > stats.step {
            return Err(malformed(
                &stats_path,
                format!(
                    "the failing step {} (after {} optimizer steps) is outside the case's {} steps",
                    stats.step, stats.resume.optimizer_steps, case.steps
                ),
            ));
        }
        let state_path = dir.join(STATE_FILE);
        let meta = std::fs::metadata(&state_path).map_err(|e| Error::io(&state_path, e))?;
        if !meta.is_file() {
            return Err(malformed(&state_path, "not a regular file".into()));
        }
        let tensors = candle_core::safetensors::load(&state_path, device)
            .map_err(|e| malformed(&state_path, crate::error::Error::from(e).to_string()))?;
        if let Some(name) = stats.tensors.keys().find(|n| !tensors.contains_key(*n)) {
            return Err(malformed(
                &state_path,
                format!("tensor `{name}` is listed in {STATS_FILE} but missing"),
            ));
        }
        if let Some(name) = tensors.keys().find(|n| !stats.tensors.contains_key(*n)) {
            return Err(malformed(
                &state_path,
                format!("tensor `{name}` is not listed in {STATS_FILE}"),
            ));
        }
        Ok(Dump {
            dir: dir.to_path_buf(),
            case,
            stats,
            tensors,
        })
    }

    /// The batch the failing step's source made, as saved (`None` for
    /// dumps written before the source's batch was saved).
    pub fn saved_batch(&self) -> Result<Option<HostBatch>> {
        let Some(inputs) = self.tensors.get("source/inputs") else {
            return Ok(None);
        };
        let state_path = self.dir.join(STATE_FILE);
        let bad = |name: &str, reason: String| {
            Error::malformed(
                Document::Dump,
                &state_path,
                format!("tensor `{name}`: {reason}"),
            )
        };
        let part = |name: &str| {
            self.tensors
                .get(name)
                .ok_or_else(|| bad(name, "missing".into()))
        };
        let cpu = |t: &Tensor| t.to_device(&Device::Cpu);
        let inputs = cpu(inputs)?;
        let dims = inputs.dims().to_vec();
        let input = match inputs.dtype() {
            candle_core::DType::F32 => HostInput::Real {
                values: inputs.flatten_all()?.to_vec1()?,
                dims,
            },
            candle_core::DType::U32 => HostInput::Tokens {
                ids: inputs.flatten_all()?.to_vec1()?,
                dims,
            },
            other => {
                return Err(bad(
                    "source/inputs",
                    format!("dtype {other:?}, expected F32 or U32"),
                ))
            }
        };
        let targets = cpu(part("source/targets")?)?;
        let (rows, classes) = targets.dims2().map_err(|_| {
            bad(
                "source/targets",
                format!("shape {:?}, expected (rows, classes)", targets.dims()),
            )
        })?;
        let labels: Vec<i64> = cpu(part("source/labels")?)?
            .to_vec1()
            .map_err(|e| bad("source/labels", Error::from(e).to_string()))?;
        if labels.len() != rows || classes != self.case.model.classes() {
            return Err(bad(
                "source/targets",
                format!(
                    "{rows} rows of {classes} classes for {} labels and a model of {} classes",
                    labels.len(),
                    self.case.model.classes()
                ),
            ));
        }
        let samples = match self.tensors.get("source/samples") {
            Some(t) => cpu(t)?
                .to_vec1::<i64>()
                .map_err(|e| bad("source/samples", Error::from(e).to_string()))?
                .into_iter()
                .map(|s| s as usize)
                .collect(),
            None => Vec::new(),
        };
        Ok(Some(HostBatch {
            input,
            labels,
            targets: targets
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1()?,
            classes,
            target_kind: self.case.loss.target_kind(),
            mix: None,
            samples,
        }))
    }

    /// The saved tensor `name`, checked against the dtype and shape the
    /// session expects of it.
    pub fn tensor(&self, name: &str, like: &Tensor) -> Result<&Tensor> {
        let state_path = self.dir.join(STATE_FILE);
        let bad = |reason: String| {
            Error::malformed(
                Document::Dump,
                &state_path,
                format!("tensor `{name}`: {reason}"),
            )
        };
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| bad("missing".into()))?;
        if t.dtype() != like.dtype() {
            return Err(bad(format!(
                "dtype {:?}, expected {:?}",
                t.dtype(),
                like.dtype()
            )));
        }
        if t.dims() != like.dims() {
            return Err(bad(format!(
                "shape {:?}, expected {:?}",
                t.dims(),
                like.dims()
            )));
        }
        Ok(t)
    }
}
