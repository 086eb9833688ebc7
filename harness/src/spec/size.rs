//! How big a case is, along the axes the minimizer shrinks, and the
//! rounding it uses for "rounder numbers" (knobs, learning rates).

use super::{case_diff, Case};
use serde::{Deserialize, Serialize};

/// How big a case is, along the axes the minimizer shrinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaseSize {
    /// Training steps.
    pub steps: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Trainable parameters.
    pub params: usize,
    /// Augmentations.
    pub augmentations: usize,
    /// Data pathologies.
    pub pathologies: usize,
    /// Leaf fields that differ from the family's default case.
    pub non_default_fields: usize,
    /// Dataset samples the case may draw, where it names them (`indices`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<usize>,
}

impl CaseSize {
    /// The size of `case`.
    pub fn of(case: &Case) -> Self {
        let non_default_fields = Case::example(case.family())
            .map(|d| case_diff(&d, case).len())
            .unwrap_or(0);
        CaseSize {
            steps: case.steps,
            batch_size: case.batch_size,
            params: case.model.param_count(),
            augmentations: case.augment.len(),
            pathologies: case.data.pathologies.len(),
            non_default_fields,
            samples: case
                .data
                .source
                .sampling()
                .and_then(|s| s.indices.as_ref())
                .map(Vec::len),
        }
    }

    /// No axis is larger than in `other`.
    pub fn within(&self, other: &CaseSize) -> bool {
        self.steps <= other.steps
            && self.batch_size <= other.batch_size
            && self.params <= other.params
            && self.augmentations <= other.augmentations
            && self.pathologies <= other.pathologies
            // Naming samples is no larger than drawing from all of them.
            && match (self.samples, other.samples) {
                (Some(a), Some(b)) => a <= b,
                (None, Some(_)) => false,
                (_, None) => true,
            }
    }
}

/// One significant digit: 0.0123 → 0.01, 3.7e-4 → 4e-4.
pub fn round1(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let p = 10f64.powf(x.abs().log10().floor());
    let r = (x / p).round() * p;
    // Formatting through a short decimal keeps the JSON short (0.01, not 0.010000000000000002).
    format!("{r:.0e}").parse().unwrap_or(r)
}
