//! A run's data: seeded synthetic data that makes a learnable task for each
//! input kind (with targets for every loss), or the samples of a dataset
//! (a file, or the user's own [`Dataset`]), plus the article's data
//! pathologies on top.
//!
//! Batches live on the host (`HostBatch`) until the runner uploads them, so
//! generation, pathologies and augmentation are plain, deterministic loops.

mod dataset;
pub mod files;
mod noise;
mod pathology;
pub mod scan;
mod source;

pub use dataset::{Dataset, MemoryDataset, Rows, SampleShape};
pub use noise::{push_noisy, NoiseMap, Scratch as NoiseScratch};
pub use pathology::{apply_pathologies, apply_pathology};
pub use source::{keep as kept_samples, open as open_source, pinned, DataSource, Sampled, Saved};

use crate::rng::Rng;
use crate::spec::{Case, DataSpec, Distribution, InputSpec, TargetKind};

/// Model inputs of one batch.
#[derive(Clone, Debug, PartialEq)]
pub enum HostInput {
    /// Real values, row-major, with dims (batch, ...).
    Real {
        /// The values.
        values: Vec<f32>,
        /// The batch's dimensions.
        dims: Vec<usize>,
    },
    /// Token ids with dims (batch, seq_len).
    Tokens {
        /// The ids.
        ids: Vec<u32>,
        /// The batch's dimensions.
        dims: Vec<usize>,
    },
}

impl HostInput {
    /// The batch's dimensions.
    pub fn dims(&self) -> &[usize] {
        match self {
            HostInput::Real { dims, .. } | HostInput::Tokens { dims, .. } => dims,
        }
    }
}

/// One batch: inputs, dense targets for the loss, the labels they came from,
/// and mixup's second target set.
#[derive(Clone, Debug, PartialEq)]
pub struct HostBatch {
    /// The model's inputs.
    pub input: HostInput,
    /// Class labels, one per target row (may be out of range under the
    /// `label_out_of_range` pathology).
    pub labels: Vec<i64>,
    /// Dense targets (rows × classes) in the form the loss wants.
    pub targets: Vec<f32>,
    /// The classes the targets range over.
    pub classes: usize,
    /// The form the targets take.
    pub target_kind: TargetKind,
    /// Mixup: the mixing weight λ and the permuted targets.
    pub mix: Option<(f64, Vec<f32>)>,
    /// The dataset index of each sample (empty for synthetic data).
    pub samples: Vec<usize>,
}

impl HostBatch {
    /// Samples in the batch.
    pub fn rows(&self) -> usize {
        self.labels.len()
    }
}

/// Class templates of a case: fixed for the whole run (keyed by seed only).
#[derive(Clone, Debug)]
pub struct Generator {
    input: InputSpec,
    classes: usize,
    per_token: bool,
    /// Each position's target is the next token (a language model's).
    next_token: bool,
    /// Samples are padded with token 0 after `min_length..=seq_len` tokens.
    padding: Option<usize>,
    target_kind: TargetKind,
    data: DataSpec,
    seed: u64,
    templates: Vec<Vec<f64>>,
}

impl Generator {
    /// The seeded generator of `case`'s synthetic data.
    pub fn new(case: &Case) -> Self {
        let input = case.model.input();
        let classes = case.model.classes();
        let mut rng = Rng::keyed(case.seed, "data.templates", 0);
        let templates = (0..classes)
            .map(|c| template(&input, c, classes, &mut rng))
            .collect();
        Generator {
            input,
            classes,
            per_token: case.model.per_token(),
            next_token: case.model.next_token(),
            padding: case.model.padding(),
            target_kind: case.loss.target_kind(),
            data: case.data.clone(),
            seed: case.seed,
            templates,
        }
    }

    /// The batch of `step` with the case's pathologies, before augmentation.
    pub fn data_batch(&self, step: usize, batch_size: usize) -> HostBatch {
        let mut batch = self.batch(step, batch_size);
        apply_pathologies(&mut batch, &self.data.pathologies, self.seed, step);
        batch
    }

    /// The raw batch of `step` (before pathologies and augmentation).
    pub fn batch(&self, step: usize, batch_size: usize) -> HostBatch {
        let step = if self.data.full_batch { 0 } else { step };
        let mut rng = Rng::keyed(self.seed, "data.batch", step as u64);
        let n = self.input.numel();
        let mut dims = vec![batch_size];
        dims.extend(self.input.dims());
        let mut labels = Vec::new();
        let input = match self.input {
            InputSpec::Tokens { seq_len, vocab } => {
                let mut ids = Vec::with_capacity(batch_size * seq_len);
                for _ in 0..batch_size {
                    let class = rng.below(self.classes);
                    if !self.per_token {
                        labels.push(class as i64);
                    }
                    if self.next_token {
                        // A language model reads positions 0..S and is taught
                        // 1..=S: mostly (9 in 10) a walk through the vocabulary
                        // in steps of 1 or 2 by the sample's class, which only
                        // the previous tokens reveal.
                        let stride = 1 + class % 2;
                        let mut id = rng.below(vocab);
                        for t in 0..=seq_len {
                            if t > 0 {
                                id = if rng.uniform() < 0.9 {
                                    (id + stride) % vocab
                                } else {
                                    rng.below(vocab)
                                };
                                labels.push((id * self.classes / vocab) as i64);
                            }
                            if t < seq_len {
                                ids.push(id as u32);
                            }
                        }
                        continue;
                    }
                    for _ in 0..seq_len {
                        // Half the tokens come from the class's band of the vocabulary.
                        let id = if rng.uniform() < 0.5 {
                            let lo = class * vocab / self.classes;
                            let hi = ((class + 1) * vocab / self.classes).max(lo + 1);
                            lo + rng.below(hi - lo)
                        } else {
                            rng.below(vocab)
                        };
                        ids.push(id as u32);
                        if self.per_token {
                            labels.push((id * self.classes / vocab) as i64);
                        }
                    }
                    if let Some(min_length) = self.padding {
                        // Token 0 is padding: none before the sample's length,
                        // only padding after it.
                        let len = min_length + rng.below(seq_len - min_length + 1);
                        let row = ids.len() - seq_len;
                        for (t, id) in ids[row..].iter_mut().enumerate() {
                            *id = if t < len { (*id).max(1) } else { 0 };
                        }
                    }
                }
                HostInput::Tokens { ids, dims }
            }
            _ => {
                let mut values = Vec::with_capacity(batch_size * n);
                let map = NoiseMap {
                    noise: self.data.noise,
                    scale: self.data.scale,
                    offset: self.data.offset,
                };
                let mut scratch = NoiseScratch::default();
                for _ in 0..batch_size {
                    let class = rng.below(self.classes);
                    labels.push(class as i64);
                    let template = &self.templates[class];
                    match self.data.distribution {
                        // the same draws and bits as `draw`, in bulk
                        Distribution::Normal => {
                            push_noisy(&mut rng, template, map, &mut values, &mut scratch);
                        }
                        other => values.extend(
                            template
                                .iter()
                                .map(|&t| map.apply(t, draw(&mut rng, other))),
                        ),
                    }
                }
                if self.per_token {
                    // Per-position targets repeat the sample's class.
                    let seq = dims[1];
                    labels = labels
                        .iter()
                        .flat_map(|&l| std::iter::repeat_n(l, seq))
                        .collect();
                }
                HostInput::Real { values, dims }
            }
        };
        let mut rng_t = Rng::keyed(self.seed, "data.targets", step as u64);
        let targets = dense_targets(&labels, self.classes, self.target_kind, &mut rng_t);
        HostBatch {
            input,
            labels,
            targets,
            classes: self.classes,
            target_kind: self.target_kind,
            mix: None,
            samples: Vec::new(),
        }
    }
}

/// "sample 3", "samples 3 and 9", "samples 3, 9 and 12" (at most 8 listed).
pub fn samples_phrase(ids: &[usize]) -> String {
    let shown: Vec<String> = ids.iter().take(8).map(usize::to_string).collect();
    let more = ids.len().saturating_sub(8);
    match (shown.as_slice(), more) {
        ([one], 0) => format!("sample {one}"),
        ([init @ .., last], 0) => format!("samples {} and {last}", init.join(", ")),
        (all, more) => format!("samples {} and {more} more", all.join(", ")),
    }
}

/// Unit-variance noise of the chosen distribution.
fn draw(rng: &mut Rng, dist: Distribution) -> f64 {
    match dist {
        Distribution::Normal => rng.normal(),
        Distribution::Uniform => rng.uniform_in(-3f64.sqrt(), 3f64.sqrt()),
        // t(2) has no finite variance: that is the point.
        Distribution::HeavyTailed => rng.student_t(2.0),
    }
}

/// A smooth, class-specific pattern: images get per-class channel offsets and
/// a low-frequency wave; sequences get a class-specific frequency.
fn template(input: &InputSpec, class: usize, classes: usize, rng: &mut Rng) -> Vec<f64> {
    match *input {
        InputSpec::Image {
            channels,
            height,
            width,
        } => {
            let mut v = Vec::with_capacity(channels * height * width);
            for _ in 0..channels {
                let offset = rng.normal();
                let (fx, fy) = (rng.uniform_in(0.5, 2.0), rng.uniform_in(0.5, 2.0));
                let phase = rng.uniform_in(0.0, std::f64::consts::TAU);
                for y in 0..height {
                    for x in 0..width {
                        let u = x as f64 / width as f64 * std::f64::consts::TAU;
                        let w = y as f64 / height as f64 * std::f64::consts::TAU;
                        v.push(offset + (fx * u + phase).sin() * (fy * w).cos());
                    }
                }
            }
            v
        }
        InputSpec::Sequence { seq_len, features } => {
            let freq = 1.0 + class as f64 * 2.0 / classes.max(1) as f64;
            let phases: Vec<f64> = (0..features)
                .map(|_| rng.uniform_in(0.0, std::f64::consts::TAU))
                .collect();
            let mut v = Vec::with_capacity(seq_len * features);
            for t in 0..seq_len {
                for p in &phases {
                    v.push((freq * t as f64 * std::f64::consts::TAU / seq_len as f64 + p).sin());
                }
            }
            v
        }
        InputSpec::Vector { features } => (0..features).map(|_| rng.normal()).collect(),
        InputSpec::Tokens { .. } => Vec::new(),
    }
}

/// Dense (rows × classes) targets of a kind, from class labels. Labels outside
/// [0, classes) give an all-zero row: silently wrong, as in real pipelines.
pub fn dense_targets(labels: &[i64], classes: usize, kind: TargetKind, rng: &mut Rng) -> Vec<f32> {
    let mut out = vec![0f32; labels.len() * classes];
    for (row, &label) in labels.iter().enumerate() {
        let hot = |c: usize| label >= 0 && c as i64 == label;
        let r = &mut out[row * classes..(row + 1) * classes];
        match kind {
            TargetKind::Labels | TargetKind::Values | TargetKind::Binary => {
                for (c, v) in r.iter_mut().enumerate() {
                    *v = if hot(c) { 1.0 } else { 0.0 };
                }
            }
            TargetKind::Counts => {
                for (c, v) in r.iter_mut().enumerate() {
                    *v = rng.poisson(if hot(c) { 3.0 } else { 0.5 }) as f32;
                }
            }
            TargetKind::Distributions => {
                // softmax(3 · one_hot): strictly positive, sums to 1.
                let z: f64 = (0..classes)
                    .map(|c| if hot(c) { 3f64.exp() } else { 1.0 })
                    .sum();
                for (c, v) in r.iter_mut().enumerate() {
                    *v = ((if hot(c) { 3f64.exp() } else { 1.0 }) / z) as f32;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_deterministic_per_step() {
        let case = Case::example("cnn").unwrap();
        let g = Generator::new(&case);
        assert_eq!(g.batch(3, 4), Generator::new(&case).batch(3, 4));
        assert_ne!(g.batch(3, 4), g.batch(4, 4));
    }

    #[test]
    fn distribution_targets_are_probabilities() {
        let mut rng = Rng::new(0);
        let t = dense_targets(&[0, 2], 3, TargetKind::Distributions, &mut rng);
        for row in t.chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            assert!(row.iter().all(|&p| p > 0.0));
        }
    }

    #[test]
    fn out_of_range_labels_give_zero_rows() {
        let mut rng = Rng::new(0);
        let t = dense_targets(&[5], 3, TargetKind::Labels, &mut rng);
        assert_eq!(t, vec![0.0; 3]);
    }
}
