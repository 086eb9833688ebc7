//! The data of a case: where samples come from (the built-in synthetic
//! generator, a dataset file, or the user's own [`crate::data::Dataset`]),
//! the synthetic generator's distribution knobs, and injected pathologies.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The distribution of the synthetic data's noise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// Gaussian noise.
    Normal,
    /// Uniform noise of the same standard deviation.
    Uniform,
    /// Student-t with 2 degrees of freedom: infinite variance, rare huge values.
    HeavyTailed,
}

/// What a case trains on: the synthetic generator's settings, the pathologies, or a source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSpec {
    /// Multiplies every input value.
    pub scale: f64,
    /// Added to every input value (after scaling).
    pub offset: f64,
    /// Distribution of the per-sample noise around the class template.
    pub distribution: Distribution,
    /// Noise standard deviation relative to the template's (0 = noiseless).
    pub noise: f64,
    /// Injected faults, applied to every batch from their `from_step` on.
    pub pathologies: Vec<Pathology>,
    /// Every step trains on the batch of step 0: full-batch gradient descent
    /// on a fixed data set (pathologies and augmentations still vary by step).
    /// Written only when set, so cases (and reproducer names) from before
    /// the field existed are unchanged.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub full_batch: bool,
    /// Where the samples come from; the synthetic generator (the default)
    /// is not written, so older cases and reproducer names are unchanged.
    #[serde(skip_serializing_if = "SourceSpec::is_synthetic")]
    pub source: SourceSpec,
}

/// Where a case's samples come from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSpec {
    /// Seeded class templates plus noise (`scale`, `offset`, `distribution`, `noise`).
    #[default]
    Synthetic,
    /// A dataset file: safetensors, `.npy`, `.npz` or CSV.
    File(FileSource),
    /// The caller's own [`crate::data::Dataset`] (`RunOptions::dataset`).
    User {
        /// What the user calls it (shown in reports and reproducers).
        name: String,
        /// How samples are drawn into batches.
        #[serde(default, skip_serializing_if = "Sampling::is_default")]
        sampling: Sampling,
    },
}

impl SourceSpec {
    /// Whether the samples come from the synthetic generator.
    pub fn is_synthetic(&self) -> bool {
        matches!(self, SourceSpec::Synthetic)
    }

    /// How samples are drawn into batches (finite sources only).
    pub fn sampling(&self) -> Option<&Sampling> {
        match self {
            SourceSpec::Synthetic => None,
            SourceSpec::File(f) => Some(&f.sampling),
            SourceSpec::User { sampling, .. } => Some(sampling),
        }
    }

    /// How samples are drawn into batches, to change (finite sources only).
    pub fn sampling_mut(&mut self) -> Option<&mut Sampling> {
        match self {
            SourceSpec::Synthetic => None,
            SourceSpec::File(f) => Some(&mut f.sampling),
            SourceSpec::User { sampling, .. } => Some(sampling),
        }
    }

    /// The probe's stage name for values that come out of the source.
    pub fn stage(&self) -> &'static str {
        match self {
            SourceSpec::Synthetic => "data.generator",
            SourceSpec::File(_) => "data.file",
            SourceSpec::User { .. } => "data.user",
        }
    }
}

/// A dataset file and the names of its parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSource {
    /// The file; a relative path is relative to the document that holds
    /// the case (case file, reproducer, dump), else to the working directory.
    pub path: PathBuf,
    /// Read as this format; by default from the extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<FileFormat>,
    /// The inputs, one row per sample: a tensor (safetensors), an array
    /// (`.npz`), ignored for `.npy` (the file is the inputs) and CSV (every
    /// column but the labels).
    #[serde(default = "default_inputs")]
    pub inputs: String,
    /// Class labels (one per sample, or one per position for per-token
    /// models): a tensor or array name, a `.npy` file beside `path`, or a
    /// CSV column. Absent, the dense targets are required.
    #[serde(default = "default_labels", skip_serializing_if = "Option::is_none")]
    pub labels: Option<String>,
    /// Dense targets (samples × classes) for regression-style losses; by
    /// default they are made from the labels, as for synthetic data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<String>,
    /// SHA-256 of the file's bytes (of every file read, in order, for
    /// `.npy`). Written into reproducers and dumps; a run refuses a file
    /// whose content differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// How samples are drawn into batches.
    #[serde(default, skip_serializing_if = "Sampling::is_default")]
    pub sampling: Sampling,
}

fn default_inputs() -> String {
    "inputs".into()
}
fn default_labels() -> Option<String> {
    Some("labels".into())
}

impl FileSource {
    /// A file read with the default names (`inputs`, `labels`).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileSource {
            path: path.into(),
            format: None,
            inputs: default_inputs(),
            labels: default_labels(),
            targets: None,
            sha256: None,
            sampling: Sampling::default(),
        }
    }
}

/// A dataset file's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// safetensors (tensors named by `inputs` and `targets`).
    Safetensors,
    /// A NumPy `.npy` array.
    Npy,
    /// A NumPy `.npz` archive of arrays.
    Npz,
    /// Comma-separated values (a header row names the columns).
    Csv,
}

/// How a finite dataset becomes the batches of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sampling {
    /// Only these samples, in this order (a reproducer keeps the samples it needs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub indices: Option<Vec<usize>>,
    /// Leave these samples out (diagnose's re-run without the bad ones).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<usize>,
    /// A new order every epoch, drawn from the case seed.
    pub shuffle: bool,
    /// Drop an epoch's last, short batch.
    pub drop_last: bool,
}

impl Sampling {
    /// Whether this is the default sampling (then it is not written).
    pub fn is_default(&self) -> bool {
        *self == Sampling::default()
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            indices: None,
            exclude: Vec::new(),
            shuffle: true,
            drop_last: false,
        }
    }
}

impl Default for DataSpec {
    fn default() -> Self {
        DataSpec {
            scale: 1.0,
            offset: 0.0,
            distribution: Distribution::Normal,
            noise: 0.5,
            pathologies: Vec::new(),
            full_batch: false,
            source: SourceSpec::Synthetic,
        }
    }
}

/// A data fault from the source article's step 2.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Pathology {
    /// NaN in this fraction of the input values (at least one).
    Nan {
        /// The fraction of input values.
        fraction: f64,
        /// The first step whose batches have it.
        #[serde(default)]
        from_step: usize,
    },
    /// +Inf or -Inf in this fraction of the input values (at least one).
    Inf {
        /// The fraction of input values.
        fraction: f64,
        /// The first step whose batches have it.
        #[serde(default)]
        from_step: usize,
    },
    /// Values of ±magnitude (up to 1e30) in this fraction of the inputs.
    Extreme {
        /// The fraction of input values.
        fraction: f64,
        /// The values' magnitude.
        magnitude: f64,
        /// The first step whose batches have it.
        #[serde(default)]
        from_step: usize,
    },
    /// One feature (channel, or sequence feature) held at a constant value.
    ConstantFeature {
        /// The feature's index.
        feature: usize,
        /// The value it is held at.
        value: f64,
        /// The first step whose batches have it.
        #[serde(default)]
        from_step: usize,
    },
    /// This fraction of the samples set to all zeros (at least one).
    AllZero {
        /// The fraction of samples.
        fraction: f64,
        /// The first step whose batches have it.
        #[serde(default)]
        from_step: usize,
    },
    /// This fraction of the input values replaced by subnormal f32 values.
    Subnormal {
        /// The fraction of input values.
        fraction: f64,
        /// The first step whose batches have it.
        #[serde(default)]
        from_step: usize,
    },
    /// This fraction of the labels set to `classes + offset` (outside the range).
    LabelOutOfRange {
        /// The fraction of labels.
        fraction: f64,
        /// How far past the last class the labels go.
        #[serde(default = "one")]
        offset: usize,
        /// The first step whose batches have it.
        #[serde(default)]
        from_step: usize,
    },
}

fn one() -> usize {
    1
}

impl Pathology {
    /// The pathology's name as stages and reports give it.
    pub fn name(&self) -> &'static str {
        match self {
            Pathology::Nan { .. } => "nan",
            Pathology::Inf { .. } => "inf",
            Pathology::Extreme { .. } => "extreme",
            Pathology::ConstantFeature { .. } => "constant_feature",
            Pathology::AllZero { .. } => "all_zero",
            Pathology::Subnormal { .. } => "subnormal",
            Pathology::LabelOutOfRange { .. } => "label_out_of_range",
        }
    }

    /// The first step whose batches have it.
    pub fn from_step(&self) -> usize {
        match *self {
            Pathology::Nan { from_step, .. }
            | Pathology::Inf { from_step, .. }
            | Pathology::Extreme { from_step, .. }
            | Pathology::ConstantFeature { from_step, .. }
            | Pathology::AllZero { from_step, .. }
            | Pathology::Subnormal { from_step, .. }
            | Pathology::LabelOutOfRange { from_step, .. } => from_step,
        }
    }

    /// The fraction it affects, where it has one.
    pub fn fraction(&self) -> Option<f64> {
        match *self {
            Pathology::Nan { fraction, .. }
            | Pathology::Inf { fraction, .. }
            | Pathology::Extreme { fraction, .. }
            | Pathology::AllZero { fraction, .. }
            | Pathology::Subnormal { fraction, .. }
            | Pathology::LabelOutOfRange { fraction, .. } => Some(fraction),
            Pathology::ConstantFeature { .. } => None,
        }
    }
}
