//! The scene of a guarded run's failure, without a `Case`: `scene.json`
//! (the finding, the last 20 losses, the gradient-norm history, batch and
//! tensor statistics, the optimizer, the environment) and
//! `scene.safetensors` (`param/<name>` and `optimizer/<kind>.<name>` from
//! before the failing step, `batch/<name>`), written atomically.

use super::optim::{OptimizerRecord, SavedOptimizer};
use super::Batch;
use crate::dump::{Environment, RECENT_LOSSES};
use crate::error::{Document, Error, Result};
use crate::finding::{Finding, Trace};
use crate::probe::{DivergenceTracker, TensorStats};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

pub const SCENE_FILE: &str = "scene.json";
pub const SCENE_TENSORS: &str = "scene.safetensors";

/// `scene.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuardScene {
    pub nanhunt_version: String,
    /// The step that failed; the saved state is from before it.
    pub step: usize,
    pub finding: Finding,
    #[serde(with = "crate::floats::vec")]
    pub recent_losses: Vec<f64>,
    #[serde(with = "crate::floats::vec")]
    pub grad_norms: Vec<f64>,
    /// The batch's tensors in order, with their statistics.
    pub batch: Vec<BatchPart>,
    /// Trainable variables, in the guard's order.
    pub vars: Vec<String>,
    pub optimizer: OptimizerRecord,
    /// The optimizer's variables by name, in its order.
    #[serde(default)]
    pub optimizer_vars: Vec<String>,
    /// Statistics of every tensor in `scene.safetensors`.
    pub tensors: BTreeMap<String, TensorStats>,
    /// Tensors the guard's `include` left out.
    #[serde(default)]
    pub omitted: Vec<String>,
    pub tracker: DivergenceTracker,
    /// The run's history before the failing step.
    pub history: Trace,
    pub environment: Environment,
    /// Half-precision gradients that came near overflow before the failure.
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchPart {
    pub name: String,
    pub dtype: String,
    pub stats: TensorStats,
}

/// What a failing guarded step leaves to write.
pub(super) struct Scene<'a> {
    pub names: &'a [String],
    pub before_params: &'a [Tensor],
    pub optimizer: Option<&'a SavedOptimizer>,
    pub optimizer_name: String,
    pub optimizer_vars: Vec<String>,
    pub tracker: &'a DivergenceTracker,
    pub history: &'a Trace,
    pub batch: &'a Batch,
    pub finding: &'a Finding,
    pub include: &'a [String],
    pub warnings: &'a [String],
}

pub(super) fn write(dir: &Path, s: &Scene) -> Result<()> {
    crate::dump::ensure_free(dir)?;
    let mut all: Vec<(String, Tensor)> = Vec::new();
    for (n, t) in s.names.iter().zip(s.before_params) {
        all.push((format!("param/{n}"), t.clone()));
    }
    if let Some(opt) = s.optimizer {
        for (key, t) in &opt.tensors {
            // `m.3` → `optimizer/m.<name of the optimizer's variable 3>`.
            let (kind, index) = key.split_once('.').unwrap_or((key, ""));
            let name = index
                .parse::<usize>()
                .ok()
                .and_then(|i| s.optimizer_vars.get(i))
                .cloned()
                .unwrap_or_else(|| index.to_string());
            all.push((format!("optimizer/{kind}.{name}"), t.clone()));
        }
    }
    let mut batch = Vec::new();
    for (n, t) in s.batch.parts() {
        batch.push(BatchPart {
            name: n.clone(),
            dtype: format!("{:?}", t.dtype()),
            stats: TensorStats::of_tensor(t)?,
        });
        all.push((format!("batch/{n}"), t.clone()));
    }
    let (kept, omitted): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(n, _)| s.include.is_empty() || s.include.iter().any(|p| n.starts_with(p)));
    let mut tensors = BTreeMap::new();
    for (n, t) in &kept {
        tensors.insert(n.clone(), TensorStats::of_tensor(t)?);
    }
    let losses = &s.finding.trace.losses;
    let scene = GuardScene {
        nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
        step: s.finding.step,
        finding: s.finding.clone(),
        recent_losses: losses[losses.len().saturating_sub(RECENT_LOSSES)..].to_vec(),
        grad_norms: s.finding.trace.grad_norms.clone(),
        batch,
        vars: s.names.to_vec(),
        optimizer: match s.optimizer {
            Some(o) => OptimizerRecord::Saved {
                spec: o.spec.clone(),
                steps: o.steps,
            },
            None => OptimizerRecord::NotAvailable {
                name: s.optimizer_name.clone(),
            },
        },
        optimizer_vars: s.optimizer_vars.clone(),
        tensors,
        omitted: omitted.into_iter().map(|(n, _)| n).collect(),
        tracker: s.tracker.clone(),
        history: s.history.clone(),
        environment: Environment::collect(&s.finding.signature.device.to_string()),
        warnings: s.warnings.to_vec(),
    };
    let map: HashMap<String, Tensor> = kept
        .into_iter()
        .map(|(n, t)| Ok((n, t.to_device(&Device::Cpu)?)))
        .collect::<Result<_>>()?;
    crate::files::write_dir_atomic(dir, |tmp| {
        crate::dump::save_tensors(&map, &tmp.join(SCENE_TENSORS))?;
        let json = serde_json::to_string_pretty(&scene).expect("a scene serializes");
        crate::files::write_synced(&tmp.join(SCENE_FILE), json.as_bytes())
    })
}

impl GuardScene {
    /// Reads a guard's scene: `scene.json` and its tensors.
    pub fn load(dir: &Path) -> Result<(GuardScene, HashMap<String, Tensor>)> {
        let path = dir.join(SCENE_FILE);
        let scene: GuardScene = serde_json::from_str(&crate::files::read_text(&path)?)
            .map_err(|e| Error::malformed(Document::Dump, &path, e.to_string()))?;
        let tensors_path = dir.join(SCENE_TENSORS);
        let tensors = candle_core::safetensors::load(&tensors_path, &Device::Cpu).map_err(|e| {
            Error::malformed(Document::Dump, &tensors_path, Error::from(e).to_string())
        })?;
        if let Some(n) = scene.tensors.keys().find(|n| !tensors.contains_key(*n)) {
            return Err(Error::malformed(
                Document::Dump,
                &tensors_path,
                format!("tensor `{n}` is listed in {SCENE_FILE} but missing"),
            ));
        }
        Ok((scene, tensors))
    }
}
