//! The synthetic data: distribution knobs and injected pathologies.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    Normal,
    Uniform,
    /// Student-t with 2 degrees of freedom: infinite variance, rare huge values.
    HeavyTailed,
}

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
        }
    }
}

/// A data fault from the source article's step 2.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Pathology {
    /// NaN in this fraction of the input values (at least one).
    Nan {
        fraction: f64,
        #[serde(default)]
        from_step: usize,
    },
    /// +Inf or -Inf in this fraction of the input values (at least one).
    Inf {
        fraction: f64,
        #[serde(default)]
        from_step: usize,
    },
    /// Values of ±magnitude (up to 1e30) in this fraction of the inputs.
    Extreme {
        fraction: f64,
        magnitude: f64,
        #[serde(default)]
        from_step: usize,
    },
    /// One feature (channel, or sequence feature) held at a constant value.
    ConstantFeature {
        feature: usize,
        value: f64,
        #[serde(default)]
        from_step: usize,
    },
    /// This fraction of the samples set to all zeros (at least one).
    AllZero {
        fraction: f64,
        #[serde(default)]
        from_step: usize,
    },
    /// This fraction of the input values replaced by subnormal f32 values.
    Subnormal {
        fraction: f64,
        #[serde(default)]
        from_step: usize,
    },
    /// This fraction of the labels set to `classes + offset` (outside the range).
    LabelOutOfRange {
        fraction: f64,
        #[serde(default = "one")]
        offset: usize,
        #[serde(default)]
        from_step: usize,
    },
}

fn one() -> usize {
    1
}

impl Pathology {
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
