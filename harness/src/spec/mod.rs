//! `Case`: the complete, serializable description of one training run.
//!
//! The same `Case` drives every command. It is JSON with a format version;
//! unknown fields are errors and [`Case::validate`] names the field at fault.

mod augment;
mod data;
mod diff;
mod examples;
pub use examples::{Size, FAMILIES};
mod loss;
mod model;
mod optim;
mod precision;
mod size;
mod validate;
mod work;

pub use augment::{Augment, NormalizeSpec};
pub use data::{DataSpec, Distribution, FileFormat, FileSource, Pathology, Sampling, SourceSpec};
pub use diff::{case_diff, FieldChange};
pub use loss::{LossSpec, TargetKind};
pub use model::*;
pub use optim::{ClipSpec, OptimizerSpec, ScheduleSpec};
pub use precision::{
    dtype_max, machine_epsilon, smallest_positive, HalfType, LossScaling, Precision, PrecisionKind,
};
pub use size::{round1, CaseSize};
pub use validate::Limits;

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The case format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// One training run, fully specified: the document nanhunt runs, minimizes and replays.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Format version; must be [`FORMAT_VERSION`].
    pub format: u32,
    /// The seed every random draw of the run is keyed by.
    pub seed: u64,
    /// Where the run trains.
    #[serde(default)]
    pub device: DeviceSpec,
    /// The precision it trains in.
    #[serde(default)]
    pub precision: Precision,
    /// Training steps.
    pub steps: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// The model.
    pub model: ModelSpec,
    /// The data.
    #[serde(default)]
    pub data: DataSpec,
    /// Batch augmentations, in order.
    #[serde(default)]
    pub augment: Vec<Augment>,
    /// The loss.
    pub loss: LossSpec,
    /// The optimizer.
    pub optimizer: OptimizerSpec,
    /// The learning-rate schedule.
    #[serde(default)]
    pub schedule: ScheduleSpec,
    /// Gradient clipping.
    #[serde(default)]
    pub clip: ClipSpec,
    /// Divergence: the smoothed loss exceeds this many times its best value.
    #[serde(default = "default_divergence_factor")]
    pub divergence_factor: f64,
}

fn default_divergence_factor() -> f64 {
    4.0
}

impl Case {
    /// Parses a case from JSON text (no validation beyond the format).
    pub fn from_json(text: &str) -> Result<Case> {
        let case: Case = serde_json::from_str(text)
            .map_err(|e| Error::Parse(crate::error::Document::Case, e.to_string()))?;
        if case.format != FORMAT_VERSION {
            return Err(Error::invalid(
                "format",
                format!(
                    "format version {} is not supported (this build reads {FORMAT_VERSION})",
                    case.format
                ),
            ));
        }
        Ok(case)
    }

    /// Reads, parses and validates a case file against the default limits.
    pub fn load(path: &Path) -> Result<Case> {
        Case::load_with_limits(path, &Limits::default())
    }

    /// Reads, parses and validates a case file against `limits`.
    pub fn load_with_limits(path: &Path, limits: &Limits) -> Result<Case> {
        let text = crate::files::read_text(path)?;
        let mut case = Case::from_json(&text).map_err(|e| e.in_file(path))?;
        case.resolve_paths(path.parent().unwrap_or(Path::new("")));
        case.validate(limits)?;
        Ok(case)
    }

    /// The case as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a Case always serializes")
    }

    /// The model's family name.
    pub fn family(&self) -> &str {
        self.model.family()
    }

    /// Reads a relative dataset path as relative to `base`, the directory
    /// of the document that holds the case.
    pub fn resolve_paths(&mut self, base: &Path) {
        if let SourceSpec::File(f) = &mut self.data.source {
            if f.path.is_relative() {
                f.path = crate::files::normalize(&base.join(&f.path));
            }
        }
    }

    /// The case as written into a document in `dir`: its dataset path
    /// relative to `dir`, so that the document and the data move together.
    pub fn with_paths_relative_to(&self, dir: &Path) -> Case {
        let mut case = self.clone();
        if let SourceSpec::File(f) = &mut case.data.source {
            f.path = crate::files::relative_to(&f.path, dir);
        }
        case
    }

    /// The case as run with a device override (`--device`), if any.
    pub fn on(&self, device: Option<DeviceSpec>) -> Case {
        let mut case = self.clone();
        if let Some(d) = device {
            case.device = d;
        }
        case
    }
}

/// Where a case runs: `cpu` or `cuda:N` (`cuda` means `cuda:0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum DeviceSpec {
    /// The CPU.
    #[default]
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Ordered by name (`cpu`, `cuda:0`, `cuda:1`, `cuda:10`, ...), as
/// signatures were when the device was a string.
impl Ord for DeviceSpec {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.to_string().cmp(&other.to_string())
    }
}

impl PartialOrd for DeviceSpec {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A device equals its name (`assert_eq!(sig.device, "cpu")`).
impl PartialEq<&str> for DeviceSpec {
    fn eq(&self, name: &&str) -> bool {
        match self {
            DeviceSpec::Cpu => *name == "cpu",
            DeviceSpec::Cuda(i) => name.strip_prefix("cuda:") == Some(i.to_string().as_str()),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(DeviceSpec::Cuda(i)),
                _ => Err(format!(
                    "unknown device `{s}`: expected `cpu`, `cuda` or `cuda:N`"
                )),
            },
        }
    }
}

impl Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
