//! Finite datasets: samples by index. Dataset files load into a
//! [`MemoryDataset`]; users whose data lives in their own code implement
//! [`Dataset`] and pass it in `RunOptions::dataset`.

use crate::error::{Error, Result};

/// What one sample of a dataset holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleShape {
    /// The input's dims per sample (a model may read them reshaped, when
    /// the value counts agree).
    pub dims: Vec<usize>,
    /// The inputs are integers (token ids, or integer-valued pixels).
    pub integer: bool,
    /// Class labels per sample: 0 (none: the targets are given), 1, or one
    /// per sequence position (a per-token objective).
    pub labels: usize,
    /// Dense targets per sample; 0 makes them from the labels.
    pub targets: usize,
}

impl SampleShape {
    /// Values per sample.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// One or more samples' values, appended by [`Dataset::append`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rows {
    /// Input values (token ids as integral floats), row-major.
    pub values: Vec<f32>,
    /// Class labels.
    pub labels: Vec<i64>,
    /// Dense targets.
    pub targets: Vec<f32>,
}

/// Samples by index.
pub trait Dataset: Send + Sync {
    /// How reports, reproducers and failures name the dataset.
    fn name(&self) -> String;
    /// Samples.
    fn len(&self) -> usize;
    /// Whether it holds no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What one sample holds.
    fn shape(&self) -> SampleShape;
    /// Appends sample `index` (< `len`) to `rows`: `shape().numel()`
    /// values, `shape().labels` labels and `shape().targets` targets.
    fn append(&self, index: usize, rows: &mut Rows) -> Result<()>;
}

/// A dataset held in memory (what a dataset file loads into).
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryDataset {
    /// What reports and reproducers call it.
    pub name: String,
    /// What one sample holds.
    pub shape: SampleShape,
    /// Input values, row-major.
    pub values: Vec<f32>,
    /// Class labels.
    pub labels: Vec<i64>,
    /// Dense targets.
    pub targets: Vec<f32>,
    /// SHA-256 of the bytes read (hex), for files.
    pub sha256: Option<String>,
}

impl MemoryDataset {
    /// Checks that the parts hold the same number of samples.
    pub fn new(
        name: String,
        shape: SampleShape,
        values: Vec<f32>,
        labels: Vec<i64>,
        targets: Vec<f32>,
    ) -> Result<Self> {
        let n = values.len() / shape.numel().max(1);
        let parts = [
            ("inputs", values.len(), shape.numel()),
            ("labels", labels.len(), shape.labels),
            ("targets", targets.len(), shape.targets),
        ];
        for (part, len, per) in parts {
            if len != n * per {
                return Err(Error::data(
                    &name,
                    format!("{part} hold {len} values, expected {per} for each of {n} samples"),
                ));
            }
        }
        Ok(MemoryDataset {
            name,
            shape,
            values,
            labels,
            targets,
            sha256: None,
        })
    }
}

impl Dataset for MemoryDataset {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn len(&self) -> usize {
        self.values.len() / self.shape.numel().max(1)
    }

    fn shape(&self) -> SampleShape {
        self.shape.clone()
    }

    fn append(&self, index: usize, rows: &mut Rows) -> Result<()> {
        let s = &self.shape;
        let (n, l, t) = (s.numel(), s.labels, s.targets);
        rows.values
            .extend_from_slice(&self.values[index * n..(index + 1) * n]);
        rows.labels
            .extend_from_slice(&self.labels[index * l..(index + 1) * l]);
        rows.targets
            .extend_from_slice(&self.targets[index * t..(index + 1) * t]);
        Ok(())
    }
}
