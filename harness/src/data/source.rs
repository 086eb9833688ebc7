//! Where a run's batches come from: the [`DataSource`] trait, its three
//! kinds (the synthetic [`Generator`], a finite [`Dataset`] drawn by the
//! case's [`Sampling`], a dump's saved batch) and the choice among them.

use super::dataset::{Dataset, Rows, SampleShape};
use super::{dense_targets, Generator, HostBatch, HostInput};
use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::spec::{Case, InputSpec, Sampling, SourceSpec, TargetKind};
use std::sync::{Arc, Mutex};

/// A producer of batches, before pathologies and augmentation.
pub trait DataSource: Send + Sync {
    /// The batch of `step` (deterministic: the same step, the same bits).
    fn batch(&self, step: usize, batch_size: usize) -> Result<HostBatch>;
    /// The dataset behind the source, if finite (for scans and shrinking).
    fn dataset(&self) -> Option<&Arc<dyn Dataset>> {
        None
    }
}

impl DataSource for Generator {
    fn batch(&self, step: usize, batch_size: usize) -> Result<HostBatch> {
        Ok(Generator::batch(self, step, batch_size))
    }
}

/// The source a case names: the generator, a dataset file (loaded once per
/// process and checked against the case's hash), or the caller's dataset.
pub fn open(
    case: &Case,
    user: Option<&Arc<dyn Dataset>>,
    max_bytes: usize,
) -> Result<Box<dyn DataSource>> {
    Ok(match &case.data.source {
        SourceSpec::Synthetic => Box::new(Generator::new(case)),
        SourceSpec::File(file) => {
            let dataset: Arc<dyn Dataset> = super::files::load(file, max_bytes)?;
            Box::new(Sampled::new(dataset, &file.sampling, case)?)
        }
        SourceSpec::User { name, sampling } => {
            let dataset = user.ok_or_else(|| {
                Error::invalid(
                    "data.source",
                    format!("the `user` source `{name}` needs its dataset (RunOptions::dataset)"),
                )
            })?;
            Box::new(Sampled::new(dataset.clone(), sampling, case)?)
        }
    })
}

/// The case with its dataset file's SHA-256 filled in (from the file as
/// loaded now), so that what is written from it names the exact data.
pub fn pinned(case: &Case, max_bytes: usize) -> Result<Case> {
    let mut case = case.clone();
    if let SourceSpec::File(file) = &mut case.data.source {
        if file.sha256.is_none() {
            file.sha256 = super::files::load(file, max_bytes)?.sha256.clone();
        }
    }
    Ok(case)
}

/// A finite dataset, batched: epochs over the samples the sampling keeps,
/// in a new order per epoch when shuffled (keyed by the case seed).
pub struct Sampled {
    dataset: Arc<dyn Dataset>,
    shape: SampleShape,
    /// The samples drawn from, before shuffling.
    base: Vec<usize>,
    shuffle: bool,
    drop_last: bool,
    full_batch: bool,
    seed: u64,
    input: InputSpec,
    classes: usize,
    per_token: bool,
    target_kind: TargetKind,
    /// The case's rescaling of real inputs: `x * scale + offset`.
    rescale: (f64, f64),
    /// The last epoch's order (steps of one epoch share it).
    order: Mutex<Option<(usize, Arc<Vec<usize>>)>>,
}

impl Sampled {
    /// Checks the dataset against the case's model and loss.
    pub fn new(dataset: Arc<dyn Dataset>, sampling: &Sampling, case: &Case) -> Result<Self> {
        let name = dataset.name();
        let shape = dataset.shape();
        let input = case.model.input();
        let len = dataset.len();
        if shape.numel() != input.numel() {
            return Err(Error::data(
                &name,
                format!(
                    "samples of shape {:?} ({} values) do not fit the model's input {:?} ({} values)",
                    shape.dims,
                    shape.numel(),
                    input.dims(),
                    input.numel()
                ),
            ));
        }
        if input.is_tokens() && !shape.integer {
            return Err(Error::data(
                &name,
                "the model reads token ids, but the inputs are not of an integer dtype",
            ));
        }
        let classes = case.model.classes();
        let per_token = case.model.per_token();
        let seq_len = input.dims()[0];
        let labels_ok = match shape.labels {
            0 => shape.targets > 0,
            1 => true,
            l => per_token && l == seq_len,
        };
        if !labels_ok {
            let want = if per_token {
                format!("1 or {seq_len} (one per position)")
            } else {
                "1 (a model predicting every position sets `per_token: true`)".into()
            };
            return Err(Error::data(
                &name,
                format!(
                    "{} labels per sample, but this model takes {want}{}",
                    shape.labels,
                    if shape.targets == 0 {
                        "; without labels, give the dense targets"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if shape.targets != 0 && shape.targets != classes * if per_token { seq_len } else { 1 } {
            return Err(Error::data(
                &name,
                format!(
                    "dense targets of {} values per sample, but the model has {classes} outputs",
                    shape.targets
                ),
            ));
        }
        let base = keep(sampling, len).map_err(|r| Error::invalid("data.source.sampling", r))?;
        if base.is_empty() {
            return Err(Error::invalid(
                "data.source.sampling",
                format!("no sample of the {len} in {name} is left to draw"),
            ));
        }
        if sampling.drop_last && case.batch_size > base.len() {
            return Err(Error::invalid(
                "batch_size",
                format!(
                    "with drop_last, a batch of {} needs at least as many samples; {} are drawn",
                    case.batch_size,
                    base.len()
                ),
            ));
        }
        if let InputSpec::Tokens { vocab, .. } = input {
            check_tokens(&*dataset, &base, vocab)?;
        }
        Ok(Sampled {
            dataset,
            shape,
            base,
            shuffle: sampling.shuffle,
            drop_last: sampling.drop_last,
            full_batch: case.data.full_batch,
            seed: case.seed,
            input,
            classes,
            per_token,
            target_kind: case.loss.target_kind(),
            rescale: (case.data.scale, case.data.offset),
            order: Mutex::new(None),
        })
    }

    /// The dataset indices of the samples in the batch of `step`.
    pub fn indices(&self, step: usize, batch_size: usize) -> Vec<usize> {
        let step = if self.full_batch { 0 } else { step };
        let n = self.base.len();
        let per_epoch = if self.drop_last {
            n / batch_size
        } else {
            n.div_ceil(batch_size)
        }
        .max(1);
        let (epoch, k) = (step / per_epoch, step % per_epoch);
        let order = self.order(epoch);
        let start = (k * batch_size).min(n);
        order[start..(start + batch_size).min(n)].to_vec()
    }

    fn order(&self, epoch: usize) -> Arc<Vec<usize>> {
        if !self.shuffle {
            return Arc::new(self.base.clone());
        }
        let mut cached = self.order.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((e, order)) = cached.as_ref() {
            if *e == epoch {
                return order.clone();
            }
        }
        let mut order = self.base.clone();
        let mut rng = Rng::keyed(self.seed, "data.shuffle", epoch as u64);
        // Fisher–Yates with the harness's RNG: the same order on every machine.
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let order = Arc::new(order);
        *cached = Some((epoch, order.clone()));
        order
    }
}

/// The samples a sampling keeps, in order; a reason naming the field when
/// it names samples that do not exist.
pub fn keep(sampling: &Sampling, len: usize) -> std::result::Result<Vec<usize>, String> {
    for (field, list) in [
        ("indices", sampling.indices.as_deref().unwrap_or(&[])),
        ("exclude", &sampling.exclude),
    ] {
        if let Some((i, &s)) = list.iter().enumerate().find(|(_, &s)| s >= len) {
            return Err(format!(
                "{field}[{i}]: sample {s} does not exist (the dataset has {len})"
            ));
        }
    }
    let mut excluded = vec![false; len];
    for &s in &sampling.exclude {
        excluded[s] = true;
    }
    let all: Box<dyn Iterator<Item = usize>> = match &sampling.indices {
        Some(list) => Box::new(list.iter().copied()),
        None => Box::new(0..len),
    };
    Ok(all.filter(|&s| !excluded[s]).collect())
}

/// Token ids must index the embedding: an id past the vocabulary is a data
/// error named by sample, not an indexing failure inside the model.
fn check_tokens(dataset: &dyn Dataset, samples: &[usize], vocab: usize) -> Result<()> {
    let mut rows = Rows::default();
    for &s in samples {
        rows.values.clear();
        dataset.append(s, &mut rows)?;
        if let Some(&v) = rows
            .values
            .iter()
            .find(|&&v| !(v >= 0.0 && (v as usize) < vocab && v.fract() == 0.0))
        {
            return Err(Error::data(
                dataset.name(),
                format!("sample {s} holds token id {v}, outside the vocabulary of {vocab}"),
            ));
        }
    }
    Ok(())
}

impl DataSource for Sampled {
    fn batch(&self, step: usize, batch_size: usize) -> Result<HostBatch> {
        let samples = self.indices(step, batch_size);
        let mut rows = Rows::default();
        for &s in &samples {
            self.dataset.append(s, &mut rows)?;
        }
        let b = samples.len();
        let numel = self.shape.numel();
        if rows.values.len() != b * numel
            || rows.labels.len() != b * self.shape.labels
            || rows.targets.len() != b * self.shape.targets
        {
            return Err(Error::data(
                self.dataset.name(),
                format!(
                    "its append gave {} values, {} labels and {} targets for {b} samples of {:?}",
                    rows.values.len(),
                    rows.labels.len(),
                    rows.targets.len(),
                    self.shape
                ),
            ));
        }
        let mut dims = vec![b];
        dims.extend(self.input.dims());
        let input = if self.input.is_tokens() {
            HostInput::Tokens {
                ids: rows.values.iter().map(|&v| v as u32).collect(),
                dims,
            }
        } else {
            let mut values = rows.values;
            let (scale, offset) = self.rescale;
            if (scale, offset) != (1.0, 0.0) {
                for v in &mut values {
                    *v = (*v as f64 * scale + offset) as f32;
                }
            }
            HostInput::Real { values, dims }
        };
        let mut labels = rows.labels;
        let positions = self.input.dims()[0];
        if self.per_token && self.shape.labels == 1 {
            // One label per sample, repeated at every position (as for synthetic data).
            labels = labels
                .iter()
                .flat_map(|&l| std::iter::repeat_n(l, positions))
                .collect();
        }
        let targets = if self.shape.targets > 0 {
            if labels.is_empty() {
                // Bookkeeping labels (the data check, mixup): each row's largest target.
                labels = rows
                    .targets
                    .chunks(self.classes)
                    .map(|r| argmax(r) as i64)
                    .collect();
            }
            rows.targets
        } else {
            let step = if self.full_batch { 0 } else { step };
            let mut rng = Rng::keyed(self.seed, "data.targets", step as u64);
            dense_targets(&labels, self.classes, self.target_kind, &mut rng)
        };
        Ok(HostBatch {
            input,
            labels,
            targets,
            classes: self.classes,
            target_kind: self.target_kind,
            mix: None,
            samples,
        })
    }

    fn dataset(&self) -> Option<&Arc<dyn Dataset>> {
        Some(&self.dataset)
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 {
                (i, v)
            } else {
                best
            }
        })
        .0
}

/// A dump's saved batch for its failing step; any other step is an error
/// (a dump replays one step).
pub struct Saved {
    /// The dump's step.
    pub step: usize,
    /// Its batch.
    pub batch: HostBatch,
}

impl DataSource for Saved {
    fn batch(&self, step: usize, _batch_size: usize) -> Result<HostBatch> {
        if step != self.step {
            return Err(Error::Rejected(format!(
                "the dump saved the batch of step {}, not of step {step}",
                self.step
            )));
        }
        Ok(self.batch.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::super::MemoryDataset;
    use super::*;

    fn dataset(n: usize) -> Arc<dyn Dataset> {
        let shape = SampleShape {
            dims: vec![64],
            integer: false,
            labels: 1,
            targets: 0,
        };
        let values = (0..n * 64).map(|v| v as f32).collect();
        let labels = (0..n as i64).map(|l| l % 10).collect();
        Arc::new(MemoryDataset::new("test".into(), shape, values, labels, vec![]).unwrap())
    }

    fn case() -> Case {
        let mut c = Case::example("cnn").unwrap();
        if let crate::spec::ModelSpec::Cnn(m) = &mut c.model {
            (m.channels, m.height, m.width, m.classes) = (1, 8, 8, 10);
        }
        c.batch_size = 4;
        c
    }

    #[test]
    fn epochs_cover_every_sample_once_in_a_seeded_order() {
        let s = Sampled::new(dataset(10), &Sampling::default(), &case()).unwrap();
        let epoch: Vec<usize> = (0..3).flat_map(|k| s.indices(k, 4)).collect();
        let mut sorted = epoch.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_eq!(s.indices(2, 4).len(), 2, "the short last batch is kept");
        assert_ne!(s.indices(0, 4), s.indices(3, 4), "a new order per epoch");
        let again = Sampled::new(dataset(10), &Sampling::default(), &case()).unwrap();
        assert_eq!(again.indices(4, 4), s.indices(4, 4));
    }

    #[test]
    fn a_rescaled_dataset_gives_its_values_in_the_new_units() {
        let plain = Sampled::new(dataset(10), &Sampling::default(), &case()).unwrap();
        let mut c = case();
        (c.data.scale, c.data.offset) = (255.0, -1.0);
        let scaled = Sampled::new(dataset(10), &Sampling::default(), &c).unwrap();
        let (HostInput::Real { values: a, .. }, HostInput::Real { values: b, .. }) = (
            plain.batch(3, 4).unwrap().input,
            scaled.batch(3, 4).unwrap().input,
        ) else {
            panic!("real inputs")
        };
        assert!(a.iter().zip(&b).all(|(x, y)| *y == *x * 255.0 - 1.0));
    }

    #[test]
    fn drop_last_indices_and_exclude_shape_the_epoch() {
        let sampling = Sampling {
            indices: Some(vec![7, 3, 5, 1, 9]),
            exclude: vec![5],
            shuffle: false,
            drop_last: true,
        };
        let s = Sampled::new(dataset(10), &sampling, &case()).unwrap();
        assert_eq!(s.indices(0, 4), vec![7, 3, 1, 9]);
        assert_eq!(s.indices(1, 4), vec![7, 3, 1, 9]);
        let b = s.batch(0, 4).unwrap();
        assert_eq!(b.samples, vec![7, 3, 1, 9]);
        assert_eq!(b.labels, vec![7, 3, 1, 9]);
        let HostInput::Real { values, dims } = &b.input else {
            panic!("real inputs")
        };
        assert_eq!(dims, &[4, 1, 8, 8]);
        assert_eq!(values[64], (3 * 64) as f32);
    }

    #[test]
    fn bad_sampling_and_shapes_are_named() {
        let missing = Sampling {
            indices: Some(vec![0, 12]),
            ..Sampling::default()
        };
        let e = Sampled::new(dataset(10), &missing, &case()).err().unwrap();
        assert!(
            e.to_string()
                .contains("indices[1]: sample 12 does not exist"),
            "{e}"
        );
        let mut wide = case();
        if let crate::spec::ModelSpec::Cnn(m) = &mut wide.model {
            m.channels = 3;
        }
        let e = Sampled::new(dataset(10), &Sampling::default(), &wide)
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("do not fit the model's input"),
            "{e}"
        );
    }
}
