//! Step 2's check of the failing step's batch, before and after
//! augmentation: non-finite and extreme values, labels out of range,
//! constant features and all-zero samples.

use crate::data::{HostBatch, HostInput};
use serde::Serialize;

/// Values beyond this magnitude count as extreme (the article's threshold).
pub const EXTREME: f64 = 1e6;

/// What the data check saw in the failing step's batch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BatchScan {
    /// Values in the batch.
    pub values: usize,
    /// NaN values.
    pub nan: usize,
    /// ±inf values.
    pub inf: usize,
    /// |x| > 1e6.
    pub extreme: usize,
    /// Labels outside the class range.
    pub labels_out_of_range: usize,
    /// Features (channels, sequence features) constant across the batch.
    pub constant_features: Vec<usize>,
    /// Samples whose every value is 0.
    pub all_zero_samples: usize,
    /// Dataset indices of the samples with a NaN, Inf or extreme value, a
    /// label out of range or all zeros (batches drawn from a dataset).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_samples: Vec<usize>,
}

impl BatchScan {
    /// The scan of `batch`.
    pub fn of(batch: &HostBatch) -> Self {
        let mut s = BatchScan {
            labels_out_of_range: batch
                .labels
                .iter()
                .filter(|&&l| l < 0 || l >= batch.classes as i64)
                .count(),
            ..BatchScan::default()
        };
        let rows = batch.samples.len().max(1);
        let per_label = (batch.labels.len() / rows).max(1);
        let mut bad = vec![false; batch.samples.len()];
        for (r, &l) in batch.labels.iter().enumerate() {
            if l < 0 || l >= batch.classes as i64 {
                if let Some(b) = bad.get_mut(r / per_label) {
                    *b = true;
                }
            }
        }
        let HostInput::Real { values, dims } = &batch.input else {
            s.bad_samples = flagged(&batch.samples, &bad);
            return s;
        };
        if !batch.samples.is_empty() {
            let per = values.len() / batch.samples.len();
            for (b, row) in bad.iter_mut().zip(values.chunks(per.max(1))) {
                *b |= row.iter().all(|&v| v == 0.0)
                    || row
                        .iter()
                        .any(|&v| !v.is_finite() || f64::from(v).abs() > EXTREME);
            }
            s.bad_samples = flagged(&batch.samples, &bad);
        }
        s.values = values.len();
        for &v in values {
            if v.is_nan() {
                s.nan += 1;
            } else if v.is_infinite() {
                s.inf += 1;
            } else if (v as f64).abs() > EXTREME {
                s.extreme += 1;
            }
        }
        let rows = dims[0].max(1);
        let per = values.len() / rows;
        s.all_zero_samples = values
            .chunks(per.max(1))
            .filter(|r| r.iter().all(|&v| v == 0.0))
            .count();
        // Feature f's values across the whole batch.
        let (features, stride_of): (usize, Box<dyn Fn(usize) -> Vec<f32>>) = if dims.len() == 4 {
            let (c, hw) = (dims[1], dims[2] * dims[3]);
            (
                c,
                Box::new(move |f| {
                    (0..rows)
                        .flat_map(|b| values[(b * c + f) * hw..(b * c + f + 1) * hw].to_vec())
                        .collect()
                }),
            )
        } else {
            let f = *dims.last().unwrap_or(&1);
            (
                f,
                Box::new(move |j| values.chunks(f).map(|row| row[j]).collect()),
            )
        };
        for f in 0..features {
            let v = stride_of(f);
            if v.len() > 1 && v.iter().all(|&x| x == v[0]) {
                s.constant_features.push(f);
            }
        }
        s
    }

    /// Sentences for the report (empty when the batch looks clean).
    pub fn findings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.nan > 0 {
            out.push(format!("{} NaN values in the inputs", self.nan));
        }
        if self.inf > 0 {
            out.push(format!("{} Inf values in the inputs", self.inf));
        }
        if self.extreme > 0 {
            out.push(format!("{} input values with |x| > 1e6", self.extreme));
        }
        if self.labels_out_of_range > 0 {
            out.push(format!(
                "{} labels outside the class range",
                self.labels_out_of_range
            ));
        }
        if !self.constant_features.is_empty() {
            out.push(format!("constant features {:?}", self.constant_features));
        }
        if self.all_zero_samples > 0 {
            out.push(format!("{} all-zero samples", self.all_zero_samples));
        }
        out
    }
}

fn flagged(samples: &[usize], bad: &[bool]) -> Vec<usize> {
    samples
        .iter()
        .zip(bad)
        .filter(|(_, &b)| b)
        .map(|(&s, _)| s)
        .collect()
}
