//! A scene read back from disk: checked whole (every listed tensor there,
//! nothing unlisted, the step inside its case), its tensors handed out
//! checked against what the driver expects, and the judgement of a replay
//! of its step — the part of a replay that does not depend on who drives
//! the step.

use super::{OptimizerRecord, Scene, CASE_FILE, SCENE_FILE, SCENE_TENSORS};
use crate::data::{HostBatch, HostInput};
use crate::error::{Document, Error, Result};
use crate::finding::{Finding, ReplayReport, Trace};
use crate::probe::{DivergenceTracker, TensorStats};
use crate::scaler::LossScaler;
use crate::spec::Case;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// A scene as loaded: its record, its case (a run of a case), its tensors.
pub struct SavedScene {
    /// The scene's directory.
    pub dir: PathBuf,
    /// Its `scene.json`.
    pub scene: Scene,
    /// Its `case.json`, for a run of a case.
    pub case: Option<Case>,
    /// Its tensors by name.
    pub tensors: HashMap<String, Tensor>,
    /// The file the tensors came from (named in errors).
    tensors_path: PathBuf,
}

/// The runner's dumps before one scene format: `stats.json`.
const LEGACY_STATS: &str = "stats.json";
const LEGACY_TENSORS: &str = "state.safetensors";

#[derive(Deserialize)]
struct LegacyStats {
    step: usize,
    finding: Option<Finding>,
    #[serde(default)]
    mix_lambda: Option<f64>,
    #[serde(with = "crate::floats::vec")]
    recent_losses: Vec<f64>,
    #[serde(with = "crate::floats::vec")]
    grad_norms: Vec<f64>,
    tensors: BTreeMap<String, TensorStats>,
    environment: super::Environment,
    resume: LegacyResume,
}

#[derive(Deserialize)]
struct LegacyResume {
    optimizer_steps: usize,
    scaler: LossScaler,
    tracker: DivergenceTracker,
    trace: Trace,
}

fn malformed(path: &Path, reason: impl Into<String>) -> Error {
    Error::malformed(Document::Dump, path, reason.into())
}

impl SavedScene {
    /// Reads a scene (or a runner's dump of an earlier version) and checks
    /// that it is whole. Errors name the file and the tensor.
    pub fn load(dir: &Path) -> Result<SavedScene> {
        let case = match dir.join(CASE_FILE) {
            path if path.is_file() => {
                let mut case = Case::from_json(&crate::files::read_text(&path)?)
                    .map_err(|e| malformed(&path, e.to_string()))?;
                case.resolve_paths(dir);
                Some(case)
            }
            _ => None,
        };
        let legacy = !dir.join(SCENE_FILE).exists() && dir.join(LEGACY_STATS).is_file();
        let (scene, json_path, tensors_path) = if legacy {
            let case = case
                .as_ref()
                .ok_or_else(|| malformed(&dir.join(CASE_FILE), "missing: a dump has its case"))?;
            let (scene, path) = legacy_scene(dir, case)?;
            (scene, path, dir.join(LEGACY_TENSORS))
        } else {
            let path = dir.join(SCENE_FILE);
            let scene: Scene = serde_json::from_str(&crate::files::read_text(&path)?)
                .map_err(|e| malformed(&path, e.to_string()))?;
            (scene, path, dir.join(SCENE_TENSORS))
        };
        if let Some(case) = &case {
            check_step(&scene, case, &json_path)?;
        }
        let tensors = load_tensors(&tensors_path, &scene, legacy)?;
        if let Some(case) = &case {
            check_case(&scene, case, &tensors, &dir.join(CASE_FILE))?;
        }
        Ok(SavedScene {
            dir: dir.to_path_buf(),
            scene,
            case,
            tensors,
            tensors_path,
        })
    }

    /// The saved tensor `name`, checked against the dtype and shape the
    /// driver expects of it (`like`).
    pub fn tensor(&self, name: &str, like: &Tensor) -> Result<&Tensor> {
        let bad =
            |reason: String| malformed(&self.tensors_path, format!("tensor `{name}`: {reason}"));
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| bad("missing (left out by the driver's `include`?)".into()))?;
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

    /// The saved tensor `name`, unchecked.
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors.get(name).ok_or_else(|| {
            malformed(
                &self.tensors_path,
                format!("tensor `{name}`: missing (left out by the driver's `include`?)"),
            )
        })
    }

    /// The step's batch as the scene lists it, by part (`batch/<part>`).
    pub fn batch_parts(&self) -> Result<Vec<(String, Tensor)>> {
        self.scene
            .batch
            .iter()
            .map(|p| {
                Ok((
                    p.name.clone(),
                    self.get(&format!("batch/{}", p.name))?.clone(),
                ))
            })
            .collect()
    }

    /// The optimizer state saved for variable `var`, by kind.
    pub fn optimizer_state(&self, var: &str) -> Vec<(String, &Tensor)> {
        self.tensors
            .iter()
            .filter_map(|(key, t)| {
                let (kind, name) = key.strip_prefix("optimizer/")?.split_once('.')?;
                (name == var).then(|| (kind.to_string(), t))
            })
            .collect()
    }

    /// The batch the runner's source made for the step (`source/<part>`,
    /// before pathologies and augmentation), or `None` for dumps written
    /// before the source's batch was saved.
    pub fn source_batch(&self, case: &Case) -> Result<Option<HostBatch>> {
        let Some(inputs) = self.tensors.get("source/inputs") else {
            return Ok(None);
        };
        let bad = |name: &str, reason: String| {
            malformed(&self.tensors_path, format!("tensor `{name}`: {reason}"))
        };
        let cpu = |t: &Tensor| t.to_device(&Device::Cpu);
        let inputs = cpu(inputs)?;
        let dims = inputs.dims().to_vec();
        let input = match inputs.dtype() {
            DType::F32 => HostInput::Real {
                values: inputs.flatten_all()?.to_vec1()?,
                dims,
            },
            DType::U32 => HostInput::Tokens {
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
        let targets = cpu(self.get("source/targets")?)?;
        let (rows, classes) = targets.dims2().map_err(|_| {
            bad(
                "source/targets",
                format!("shape {:?}, expected (rows, classes)", targets.dims()),
            )
        })?;
        let labels: Vec<i64> = cpu(self.get("source/labels")?)?
            .to_vec1()
            .map_err(|e| bad("source/labels", Error::from(e).to_string()))?;
        if labels.len() != rows || classes != case.model.classes() {
            return Err(bad(
                "source/targets",
                format!(
                    "{rows} rows of {classes} classes for {} labels and a model of {} classes",
                    labels.len(),
                    case.model.classes()
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
            targets: targets.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
            classes,
            target_kind: case.loss.target_kind(),
            mix: None,
            samples,
        }))
    }

    /// The judgement of a replay of the scene's step: `actual` is what the
    /// step gave now, `now` the history after it. The loss is compared
    /// bit for bit when both the recorded and the replayed step computed one
    /// (a NaN as a NaN: the scene's JSON keeps no NaN's sign or payload).
    pub fn report(&self, actual: Option<Finding>, now: &Trace) -> ReplayReport {
        let before = self.scene.history.losses.len();
        let recorded_computed = self
            .scene
            .finding
            .as_ref()
            .is_none_or(|f| f.trace.losses.len() > before);
        let replayed = actual.as_ref().map_or(now, |f| &f.trace);
        let bit_identical = match (replayed.losses.last(), self.scene.recent_losses.last()) {
            (Some(a), Some(b)) if recorded_computed && replayed.losses.len() > before => {
                Some(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()))
            }
            _ => None,
        };
        let expected = self.scene.finding.as_ref().map(|f| f.signature.clone());
        ReplayReport::new(expected, self.scene.step, actual, bit_identical)
            .with_determinism(self.scene.deterministic)
    }
}

/// A runner's dump of an earlier version as a scene.
fn legacy_scene(dir: &Path, case: &Case) -> Result<(Scene, PathBuf)> {
    let path = dir.join(LEGACY_STATS);
    let stats: LegacyStats = serde_json::from_str(&crate::files::read_text(&path)?)
        .map_err(|e| malformed(&path, e.to_string()))?;
    let names = |prefix: &str| -> Vec<String> {
        stats
            .tensors
            .keys()
            .filter_map(|k| k.strip_prefix(prefix).map(str::to_string))
            .collect()
    };
    let batch = names("batch/")
        .into_iter()
        .map(|name| {
            let stats = stats.tensors[&format!("batch/{name}")].clone();
            super::BatchPart {
                name,
                dtype: String::new(),
                stats,
            }
        })
        .collect();
    let scene = Scene {
        nanhunt_version: String::new(),
        step: stats.step,
        finding: stats.finding,
        recent_losses: stats.recent_losses,
        grad_norms: stats.grad_norms,
        batch,
        mix_lambda: stats.mix_lambda,
        vars: names("param/"),
        optimizer: OptimizerRecord::Saved {
            spec: case.optimizer.clone(),
            steps: stats.resume.optimizer_steps,
        },
        optimizer_vars: Vec::new(),
        tensors: stats.tensors,
        omitted: Vec::new(),
        tracker: stats.resume.tracker,
        scaler: Some(stats.resume.scaler),
        history: stats.resume.trace,
        environment: stats.environment,
        warnings: Vec::new(),
        deterministic: None,
        origin: None,
    };
    Ok((scene, path))
}

/// The scene's step lies inside its case, after no more optimizer steps.
fn check_step(scene: &Scene, case: &Case, path: &Path) -> Result<()> {
    let steps = match &scene.optimizer {
        OptimizerRecord::Saved { steps, .. } => *steps,
        OptimizerRecord::NotAvailable { .. } => 0,
    };
    if scene.step >= case.steps || steps > scene.step {
        return Err(malformed(
            path,
            format!(
                "the failing step {} (after {steps} optimizer steps) is outside the case's {} steps",
                scene.step, case.steps
            ),
        ));
    }
    Ok(())
}

/// The case beside a scene is the one its step ran: the same optimizer,
/// and a batch of its batch size, in the dtypes its input kind has.
fn check_case(
    scene: &Scene,
    case: &Case,
    tensors: &HashMap<String, Tensor>,
    path: &Path,
) -> Result<()> {
    if let OptimizerRecord::Saved { spec, .. } = &scene.optimizer {
        if spec != &case.optimizer {
            return Err(malformed(
                path,
                format!(
                    "field `optimizer`: {} with lr {}, where the scene's step ran {} with lr {}",
                    case.optimizer.name(),
                    case.optimizer.lr(),
                    spec.name(),
                    spec.lr()
                ),
            ));
        }
    }
    let Some(inputs) = tensors.get("source/inputs") else {
        return Ok(());
    };
    let rows = inputs.dims().first().copied().unwrap_or(0);
    if rows != case.batch_size {
        return Err(malformed(
            path,
            format!(
                "field `batch_size`: {}, where the scene's batch has {rows} rows",
                case.batch_size
            ),
        ));
    }
    let input = match case.model.input() {
        crate::spec::InputSpec::Tokens { .. } => DType::U32,
        _ => DType::F32,
    };
    for (name, want) in [
        ("source/inputs", input),
        ("source/targets", DType::F32),
        ("source/labels", DType::I64),
        ("source/samples", DType::I64),
    ] {
        if let Some(t) = tensors.get(name).filter(|t| t.dtype() != want) {
            return Err(malformed(
                &path.with_file_name(SCENE_TENSORS),
                format!("tensor `{name}`: dtype {:?}, expected {want:?}", t.dtype()),
            ));
        }
    }
    Ok(())
}

/// The scene's tensors: exactly the ones its record lists.
fn load_tensors(path: &Path, scene: &Scene, legacy: bool) -> Result<HashMap<String, Tensor>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(malformed(path, "not a regular file"));
    }
    let tensors = candle_core::safetensors::load(path, &Device::Cpu)
        .map_err(|e| malformed(path, Error::from(e).to_string()))?;
    let listed_in = if legacy { LEGACY_STATS } else { SCENE_FILE };
    if let Some(name) = scene.tensors.keys().find(|n| !tensors.contains_key(*n)) {
        return Err(malformed(
            path,
            format!("tensor `{name}` is listed in {listed_in} but missing"),
        ));
    }
    if let Some(name) = tensors.keys().find(|n| !scene.tensors.contains_key(*n)) {
        return Err(malformed(
            path,
            format!("tensor `{name}` is not listed in {listed_in}"),
        ));
    }
    if !legacy {
        check_batch(path, scene, &tensors)?;
    }
    Ok(tensors)
}

/// The saved batch is the batch the scene describes: its statistics,
/// recomputed from the file, equal the recorded ones bit for bit (an
/// edited or swapped batch would replay another step than the one that
/// failed).
fn check_batch(path: &Path, scene: &Scene, tensors: &HashMap<String, Tensor>) -> Result<()> {
    for (name, t) in tensors {
        if !(name.starts_with("batch/") || name.starts_with("source/")) {
            continue;
        }
        let want = &scene.tensors[name];
        // A batch part keeps its dtype (the same values in another dtype
        // are another batch).
        if let Some(part) = name
            .strip_prefix("batch/")
            .and_then(|n| scene.batch.iter().find(|p| p.name == n))
        {
            let dtype = format!("{:?}", t.dtype());
            if !part.dtype.is_empty() && dtype != part.dtype {
                return Err(malformed(
                    path,
                    format!(
                        "tensor `{name}`: dtype {dtype}, where {SCENE_FILE} records {}",
                        part.dtype
                    ),
                ));
            }
        }
        let have = TensorStats::of_tensor(t)?;
        if !have.same_bits(want) {
            return Err(malformed(
                path,
                format!(
                    "tensor `{name}` is not the batch {SCENE_FILE} records: {} values ({} NaN, {} Inf), mean {:e}, max {:e}; the scene says {} ({} NaN, {} Inf), mean {:e}, max {:e}",
                    have.count, have.nan, have.inf, have.mean, have.max,
                    want.count, want.nan, want.inf, want.mean, want.max
                ),
            ));
        }
    }
    Ok(())
}
