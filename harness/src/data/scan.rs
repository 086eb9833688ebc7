//! The source article's `check_data_sanity`, over a whole dataset rather
//! than one batch: non-finite and extreme values, labels outside the class
//! range, all-zero and duplicated samples, constant features, per-feature
//! statistics with a robust scale, the offending samples by index and the
//! fixes the article names. A file is scanned as a stream, a chunk of
//! samples at a time: memory grows with the sample count (one hash per
//! sample, for duplicates) and the feature count, not with the file.

use super::dataset::{Dataset, Rows, SampleShape};
use super::files::{self, Chunk};
use crate::error::Result;
use crate::rng::Rng;
use crate::spec::FileSource;
use serde::Serialize;
use std::collections::HashMap;
use std::hash::Hasher;

/// What a scan checks and how much it lists.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ScanOptions {
    /// The class count labels must stay below; `None` checks only that
    /// labels are not negative (and says so).
    pub classes: Option<usize>,
    /// Finite values beyond this magnitude are extreme (the article: 1e6).
    pub extreme: f64,
    /// Sample indices listed per problem (all are counted).
    pub max_listed: usize,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            classes: None,
            extreme: 1e6,
            max_listed: 100,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    Nan,
    Inf,
    Extreme,
    LabelOutOfRange,
    AllZeroSample,
    ConstantFeature,
    DuplicateSample,
}

impl ProblemKind {
    /// Whether the kind breaks training (exit 1) or only deserves a look.
    pub fn is_error(self) -> bool {
        !matches!(
            self,
            ProblemKind::ConstantFeature | ProblemKind::DuplicateSample
        )
    }

    /// The kind as the JSON report writes it.
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::Nan => "nan",
            ProblemKind::Inf => "inf",
            ProblemKind::Extreme => "extreme",
            ProblemKind::LabelOutOfRange => "label_out_of_range",
            ProblemKind::AllZeroSample => "all_zero_sample",
            ProblemKind::ConstantFeature => "constant_feature",
            ProblemKind::DuplicateSample => "duplicate_sample",
        }
    }

    fn title(self) -> &'static str {
        match self {
            ProblemKind::Nan => "NaN values",
            ProblemKind::Inf => "infinite values",
            ProblemKind::Extreme => "extreme values",
            ProblemKind::LabelOutOfRange => "labels outside the class range",
            ProblemKind::AllZeroSample => "all-zero samples",
            ProblemKind::ConstantFeature => "constant features",
            ProblemKind::DuplicateSample => "duplicated samples",
        }
    }

    /// The article's fix.
    fn fix(self) -> &'static str {
        match self {
            ProblemKind::Nan => "impute the missing values (the feature's median or mean) or drop the samples",
            ProblemKind::Inf => "find the division or log that made them; clip, or drop the samples",
            ProblemKind::Extreme => "robust-scale the features ((x - median) / IQR) or clip them",
            ProblemKind::LabelOutOfRange => "label-encode the labels to 0..classes-1, or give the model as many classes as the data has",
            ProblemKind::AllZeroSample => "check the loader for empty reads or padding; drop the samples",
            ProblemKind::ConstantFeature => "drop the features: standardizing them divides by a zero std (NaN)",
            ProblemKind::DuplicateSample => "deduplicate (duplicates weigh some samples twice and leak across splits)",
        }
    }
}

/// One kind of problem, with the samples (or features) it was seen in.
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    pub kind: ProblemKind,
    /// `error` breaks training; `warning` deserves a look.
    pub severity: &'static str,
    /// Samples (or, for constant features, features) affected.
    pub count: usize,
    /// The first of them, by index (at most `max_listed`).
    pub indices: Vec<usize>,
    pub detail: String,
    pub fix: &'static str,
}

/// Statistics of one feature (one value position of a sample) over the
/// dataset; non-finite values are counted, not averaged.
#[derive(Clone, Debug, Serialize)]
pub struct FeatureStats {
    pub index: usize,
    #[serde(with = "crate::floats::one")]
    pub min: f64,
    #[serde(with = "crate::floats::one")]
    pub max: f64,
    #[serde(with = "crate::floats::one")]
    pub mean: f64,
    #[serde(with = "crate::floats::one")]
    pub std: f64,
    /// Median and interquartile range, estimated from a seeded reservoir
    /// of samples (`reservoir` in the scan).
    #[serde(with = "crate::floats::one")]
    pub median: f64,
    #[serde(with = "crate::floats::one")]
    pub iqr: f64,
    pub nan: usize,
    pub inf: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct LabelStats {
    /// The class count checked against, and where it came from.
    pub classes: Option<usize>,
    pub min: i64,
    pub max: i64,
    /// Samples per label value, for labels in 0..1024.
    pub counts: Vec<usize>,
}

/// The result of a scan.
#[derive(Clone, Debug, Serialize)]
pub struct DataScan {
    pub dataset: String,
    pub samples: usize,
    /// Values per sample, and their layout.
    pub features: usize,
    pub dims: Vec<usize>,
    /// Bytes of values scanned (8 per value: they are scanned as f64).
    pub values: u64,
    pub problems: Vec<Problem>,
    pub feature_stats: Vec<FeatureStats>,
    pub labels: Option<LabelStats>,
    /// Samples in the robust-scale reservoir.
    pub reservoir: usize,
}

impl DataScan {
    /// Whether anything breaks training (warnings do not count).
    pub fn has_errors(&self) -> bool {
        self.problems.iter().any(|p| p.kind.is_error())
    }

    pub fn problem(&self, kind: ProblemKind) -> Option<&Problem> {
        self.problems.iter().find(|p| p.kind == kind)
    }

    /// The samples an error names (all of them when `max_listed` allowed).
    pub fn bad_samples(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .problems
            .iter()
            .filter(|p| p.kind.is_error())
            .flat_map(|p| p.indices.iter().copied())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a scan always serializes")
    }

    pub fn to_markdown(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "# Data scan: {}\n", self.dataset);
        let _ = writeln!(
            s,
            "{} samples of {:?} ({} values each).\n",
            self.samples, self.dims, self.features
        );
        if self.problems.is_empty() {
            let _ = writeln!(s, "No problems found.\n");
        }
        for p in &self.problems {
            let listed = list(&p.indices, p.count);
            let what = if p.kind == ProblemKind::ConstantFeature {
                "features"
            } else {
                "samples"
            };
            let _ = writeln!(
                s,
                "## {} ({}): {} {what}\n\n{}\n\n{what}: {listed}\n\nFix: {}\n",
                p.kind.title(),
                p.severity,
                p.count,
                p.detail,
                p.fix
            );
        }
        if let Some(l) = &self.labels {
            let classes = l
                .classes
                .map_or("not given (only negative labels checked)".into(), |c| {
                    c.to_string()
                });
            let _ = writeln!(
                s,
                "## Labels\n\nrange {}..={}; classes: {classes}; samples per label: {:?}\n",
                l.min, l.max, l.counts
            );
        }
        let _ = writeln!(
            s,
            "## Features\n\nmedian and IQR estimated from {} samples.\n\n| feature | min | max | mean | std | median | IQR | NaN | Inf |\n|---|---|---|---|---|---|---|---|---|",
            self.reservoir
        );
        const SHOWN: usize = 64;
        for f in self.feature_stats.iter().take(SHOWN) {
            let _ = writeln!(
                s,
                "| {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {} | {} |",
                f.index, f.min, f.max, f.mean, f.std, f.median, f.iqr, f.nan, f.inf
            );
        }
        if self.feature_stats.len() > SHOWN {
            let _ = writeln!(
                s,
                "\n({} more features in the JSON report.)",
                self.feature_stats.len() - SHOWN
            );
        }
        s
    }
}

fn list(indices: &[usize], count: usize) -> String {
    let mut s = indices
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if count > indices.len() {
        s.push_str(&format!(", … ({} more)", count - indices.len()));
    }
    s
}

/// Per-feature sums, shifted by the feature's first finite value so that
/// large offsets do not cancel the variance away.
#[derive(Clone, Copy)]
struct Feature {
    shift: Option<f64>,
    n: u64,
    sum: f64,
    sum_sq: f64,
    min: f64,
    max: f64,
    nan: usize,
    inf: usize,
}

impl Default for Feature {
    fn default() -> Self {
        Feature {
            shift: None,
            n: 0,
            sum: 0.0,
            sum_sq: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            nan: 0,
            inf: 0,
        }
    }
}

/// A problem's count and listed indices, as the scan goes.
#[derive(Default)]
struct Seen {
    count: usize,
    indices: Vec<usize>,
}

impl Seen {
    fn add(&mut self, index: usize, max: usize) {
        self.count += 1;
        if self.indices.len() < max {
            self.indices.push(index);
        }
    }
}

/// The scan's running state: fed chunks of samples, in order.
pub struct Scanner {
    opts: ScanOptions,
    shape: SampleShape,
    next: usize,
    values: u64,
    features: Vec<Feature>,
    seen: HashMap<ProblemKind, Seen>,
    extreme_max: f64,
    /// One 64-bit hash per sample with its index; sorted at the end to find
    /// duplicates (16 bytes a sample; a false duplicate has odds of about
    /// n² / 2⁶⁵, a few in a billion for a million samples).
    hashes: Vec<(u64, u32)>,
    labels: Option<(i64, i64, Vec<usize>)>,
    reservoir: Vec<Vec<f64>>,
    capacity: usize,
    rng: Rng,
}

impl Scanner {
    pub fn new(shape: SampleShape, opts: ScanOptions) -> Self {
        let f = shape.numel();
        // The reservoir holds at most about 4M values (32 MB).
        let capacity = ((4usize << 20) / f.max(1)).clamp(16, 2048);
        Scanner {
            features: vec![Feature::default(); f],
            shape,
            opts,
            next: 0,
            values: 0,
            seen: HashMap::new(),
            extreme_max: 0.0,
            hashes: Vec::new(),
            labels: None,
            reservoir: Vec::new(),
            capacity,
            rng: Rng::keyed(0, "scan.reservoir", 0),
        }
    }

    /// Feeds the chunk's samples (values, labels, targets as read), the
    /// next ones in the file.
    pub fn push(&mut self, chunk: &Chunk) {
        self.push_with(chunk, None)
    }

    /// Feeds samples whose dataset indices are `ids` (else the next ones).
    fn push_with(&mut self, chunk: &Chunk, ids: Option<&[usize]>) {
        let f = self.shape.numel();
        let l = self.shape.labels;
        let k = chunk.values.len().checked_div(f).unwrap_or(0);
        let max = self.opts.max_listed;
        for row in 0..k {
            let position = self.next + row;
            let index = ids.map_or(position, |ids| ids[row]);
            let sample = &chunk.values[row * f..(row + 1) * f];
            let (mut nan, mut inf, mut extreme, mut zero) = (false, false, false, true);
            let mut hash = std::hash::DefaultHasher::new();
            for (feat, &v) in self.features.iter_mut().zip(sample) {
                hash.write_u64(v.to_bits());
                if v.is_nan() {
                    feat.nan += 1;
                    nan = true;
                    zero = false;
                    continue;
                }
                if v.is_infinite() {
                    feat.inf += 1;
                    inf = true;
                    zero = false;
                    continue;
                }
                zero &= v == 0.0;
                let a = v.abs();
                if a > self.opts.extreme {
                    extreme = true;
                    self.extreme_max = self.extreme_max.max(a);
                }
                let shift = *feat.shift.get_or_insert(v);
                let d = v - shift;
                feat.n += 1;
                feat.sum += d;
                feat.sum_sq += d * d;
                feat.min = feat.min.min(v);
                feat.max = feat.max.max(v);
            }
            for (flag, kind) in [
                (nan, ProblemKind::Nan),
                (inf, ProblemKind::Inf),
                (extreme, ProblemKind::Extreme),
                (zero && f > 0, ProblemKind::AllZeroSample),
            ] {
                if flag {
                    self.seen.entry(kind).or_default().add(index, max);
                }
            }
            let labels = &chunk.labels[row * l..(row + 1) * l];
            let mut bad_label = false;
            for &y in labels {
                hash.write_i64(y);
                let (lo, hi, counts) = self.labels.get_or_insert((y, y, Vec::new()));
                *lo = (*lo).min(y);
                *hi = (*hi).max(y);
                if (0..1024).contains(&y) {
                    let y = y as usize;
                    if counts.len() <= y {
                        counts.resize(y + 1, 0);
                    }
                    counts[y] += 1;
                }
                bad_label |= y < 0 || self.opts.classes.is_some_and(|c| y >= c as i64);
            }
            if bad_label {
                self.seen
                    .entry(ProblemKind::LabelOutOfRange)
                    .or_default()
                    .add(index, max);
            }
            self.hashes.push((hash.finish(), index as u32));
            // Reservoir sampling (algorithm R) over whole samples.
            if self.reservoir.len() < self.capacity {
                self.reservoir.push(sample.to_vec());
            } else {
                let j = self.rng.below(position + 1);
                if j < self.capacity {
                    self.reservoir[j] = sample.to_vec();
                }
            }
        }
        self.next += k;
        self.values += (k * f) as u64;
    }

    pub fn finish(mut self, dataset: String) -> DataScan {
        let f = self.shape.numel();
        // Equal hashes sort together; the first of a run is the original
        // (indices ascend within a run: the sort is stable).
        self.hashes.sort_by_key(|&(h, _)| h);
        let mut duplicate_of = Vec::new();
        for run in self.hashes.chunk_by(|a, b| a.0 == b.0) {
            let first = run.iter().map(|&(_, i)| i).min().unwrap_or(0) as usize;
            for &(_, i) in run.iter().filter(|&&(_, i)| i as usize != first) {
                duplicate_of.push((i as usize, first));
            }
        }
        duplicate_of.sort_unstable();
        for &(d, _) in &duplicate_of {
            self.seen
                .entry(ProblemKind::DuplicateSample)
                .or_default()
                .add(d, self.opts.max_listed);
        }
        let mut columns: Vec<Vec<f64>> = vec![Vec::with_capacity(self.reservoir.len()); f];
        for sample in &self.reservoir {
            for (c, &v) in columns.iter_mut().zip(sample) {
                if v.is_finite() {
                    c.push(v);
                }
            }
        }
        let feature_stats: Vec<FeatureStats> = self
            .features
            .iter()
            .zip(columns.iter_mut())
            .enumerate()
            .map(|(index, (feat, col))| {
                col.sort_by(f64::total_cmp);
                let q = |p: f64| {
                    if col.is_empty() {
                        f64::NAN
                    } else {
                        col[((col.len() - 1) as f64 * p).round() as usize]
                    }
                };
                let n = feat.n as f64;
                let (mean, std) = if feat.n == 0 {
                    (f64::NAN, f64::NAN)
                } else {
                    let m = feat.sum / n;
                    (
                        feat.shift.unwrap_or(0.0) + m,
                        (feat.sum_sq / n - m * m).max(0.0).sqrt(),
                    )
                };
                FeatureStats {
                    index,
                    min: if feat.n == 0 { f64::NAN } else { feat.min },
                    max: if feat.n == 0 { f64::NAN } else { feat.max },
                    mean,
                    std,
                    median: q(0.5),
                    iqr: q(0.75) - q(0.25),
                    nan: feat.nan,
                    inf: feat.inf,
                }
            })
            .collect();
        let mut problems = Vec::new();
        let samples = self.next;
        let mut order: Vec<ProblemKind> = self.seen.keys().copied().collect();
        order.sort();
        for kind in order {
            let seen = self.seen.remove(&kind).expect("a key of the map");
            let detail = match kind {
                ProblemKind::Nan | ProblemKind::Inf => {
                    let (counts, what) = if kind == ProblemKind::Nan {
                        (
                            feature_stats.iter().map(|f| f.nan).collect::<Vec<_>>(),
                            "NaN",
                        )
                    } else {
                        (feature_stats.iter().map(|f| f.inf).collect(), "±Inf")
                    };
                    let total: usize = counts.iter().sum();
                    let features = counts.iter().filter(|&&c| c > 0).count();
                    format!("{total} {what} values in {features} of the {f} features")
                }
                ProblemKind::Extreme => format!(
                    "values beyond ±{:e}, up to {:e}",
                    self.opts.extreme, self.extreme_max
                ),
                ProblemKind::LabelOutOfRange => match self.opts.classes {
                    Some(c) => format!("labels outside 0..{c}"),
                    None => "negative labels".into(),
                },
                ProblemKind::AllZeroSample => "every value of the sample is 0".into(),
                ProblemKind::DuplicateSample => {
                    let pairs: Vec<String> = duplicate_of
                        .iter()
                        .take(5)
                        .map(|(d, o)| format!("{d} = {o}"))
                        .collect();
                    format!(
                        "samples equal (values and labels) to an earlier one: {}",
                        pairs.join(", ")
                    )
                }
                ProblemKind::ConstantFeature => unreachable!("features are checked below"),
            };
            problems.push(problem(kind, seen, detail));
        }
        let constant: Vec<usize> = feature_stats
            .iter()
            .filter(|s| s.nan + s.inf < samples && s.min == s.max)
            .map(|s| s.index)
            .collect();
        if !constant.is_empty() && samples > 1 {
            let seen = Seen {
                count: constant.len(),
                indices: constant
                    .iter()
                    .copied()
                    .take(self.opts.max_listed)
                    .collect(),
            };
            problems.push(problem(
                ProblemKind::ConstantFeature,
                seen,
                "a feature (value position) that holds one value in every sample".into(),
            ));
        }
        problems.sort_by_key(|p| (!p.kind.is_error(), p.kind));
        DataScan {
            dataset,
            samples,
            features: f,
            dims: self.shape.dims.clone(),
            values: self.values * 8,
            problems,
            feature_stats,
            labels: self.labels.map(|(min, max, counts)| LabelStats {
                classes: self.opts.classes,
                min,
                max,
                counts,
            }),
            reservoir: self.reservoir.len(),
        }
    }
}

fn problem(kind: ProblemKind, seen: Seen, detail: String) -> Problem {
    Problem {
        kind,
        severity: if kind.is_error() { "error" } else { "warning" },
        count: seen.count,
        indices: seen.indices,
        detail,
        fix: kind.fix(),
    }
}

/// Samples per chunk for a sample of `numel` values (about 1M values).
fn chunk_samples(numel: usize) -> usize {
    ((1usize << 20) / numel.max(1)).max(1)
}

/// Scans a dataset file as a stream.
pub fn scan_file(source: &FileSource, opts: &ScanOptions) -> Result<DataScan> {
    let mut reader = files::open(source)?;
    let shape = reader.shape().clone();
    let per = chunk_samples(shape.numel());
    let mut opts = opts.clone();
    opts.classes = opts.classes.or(reader.classes());
    let mut scanner = Scanner::new(shape, opts);
    let mut chunk = Chunk::default();
    loop {
        chunk.clear();
        if reader.read(per, &mut chunk)? == 0 {
            break;
        }
        scanner.push(&chunk);
    }
    Ok(scanner.finish(source.path.display().to_string()))
}

/// Scans the samples `indices` of a dataset (all when `None`).
pub fn scan_dataset(
    dataset: &dyn Dataset,
    indices: Option<&[usize]>,
    opts: &ScanOptions,
) -> Result<DataScan> {
    let shape = dataset.shape();
    let per = chunk_samples(shape.numel());
    let all: Vec<usize>;
    let indices = match indices {
        Some(i) => i,
        None => {
            all = (0..dataset.len()).collect();
            &all
        }
    };
    let mut scanner = Scanner::new(shape, opts.clone());
    let mut rows = Rows::default();
    for block in indices.chunks(per) {
        rows.values.clear();
        rows.labels.clear();
        rows.targets.clear();
        for &i in block {
            dataset.append(i, &mut rows)?;
        }
        let chunk = Chunk {
            values: rows.values.iter().map(|&v| f64::from(v)).collect(),
            labels: rows.labels.clone(),
            targets: Vec::new(),
        };
        scanner.push_with(&chunk, Some(block));
    }
    Ok(scanner.finish(dataset.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::MemoryDataset;

    fn dataset(values: Vec<f32>, labels: Vec<i64>) -> MemoryDataset {
        let shape = SampleShape {
            dims: vec![2],
            integer: false,
            labels: 1,
            targets: 0,
        };
        MemoryDataset::new("t".into(), shape, values, labels, Vec::new()).unwrap()
    }

    #[test]
    fn duplicates_constant_features_and_statistics() {
        // Samples: (1, 5) (2, 5) (1, 5) (3, 5) (2, 5); labels 0 1 0 1 0.
        let d = dataset(
            vec![1.0, 5.0, 2.0, 5.0, 1.0, 5.0, 3.0, 5.0, 2.0, 5.0],
            vec![0, 1, 0, 1, 0],
        );
        let scan = scan_dataset(&d, None, &ScanOptions::default()).unwrap();
        // Sample 2 repeats sample 0; sample 4 has 1's values but 0's label.
        let dup = scan.problem(ProblemKind::DuplicateSample).unwrap();
        assert_eq!(dup.indices, vec![2]);
        let constant = scan.problem(ProblemKind::ConstantFeature).unwrap();
        assert_eq!(constant.indices, vec![1]);
        assert!(!scan.has_errors(), "warnings only");
        let f0 = &scan.feature_stats[0];
        assert_eq!((f0.min, f0.max, f0.median), (1.0, 3.0, 2.0));
        assert!((f0.mean - 1.8).abs() < 1e-12);
        assert!((f0.std - 0.56f64.sqrt()).abs() < 1e-12);
        assert_eq!(scan.labels.as_ref().unwrap().counts, vec![3, 2]);
    }

    #[test]
    fn a_subset_reports_dataset_indices() {
        let d = dataset(
            vec![0.0, 1.0, f32::NAN, 1.0, 2.0, 1.0, 3.0, f32::INFINITY],
            vec![0, 1, 0, 7],
        );
        let opts = ScanOptions {
            classes: Some(2),
            ..ScanOptions::default()
        };
        let scan = scan_dataset(&d, Some(&[3, 1]), &opts).unwrap();
        assert_eq!(scan.samples, 2);
        assert_eq!(scan.problem(ProblemKind::Nan).unwrap().indices, vec![1]);
        assert_eq!(scan.problem(ProblemKind::Inf).unwrap().indices, vec![3]);
        assert_eq!(
            scan.problem(ProblemKind::LabelOutOfRange).unwrap().indices,
            vec![3]
        );
        assert_eq!(scan.bad_samples(), vec![1, 3]);
    }
}
