//! What a data scan found, and how it reads as Markdown and JSON.

use serde::Serialize;

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
    /// Bytes the scan may hold (`scan-data --max-memory-mib`); it sizes
    /// the chunk, the quantile reservoir and the duplicate table.
    pub max_memory: usize,
    /// Threads that scan a chunk's blocks (1: the calling thread alone).
    /// The report is the same, to the bit, for any number.
    pub threads: usize,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            classes: None,
            extreme: 1e6,
            max_listed: 100,
            max_memory: 64 << 20,
            threads: 1,
        }
    }
}

/// What kind of problem a scan found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// NaN input values.
    Nan,
    /// ±inf input values.
    Inf,
    /// Values far outside the dataset's robust scale.
    Extreme,
    /// Labels outside the class range.
    LabelOutOfRange,
    /// Samples whose every value is 0.
    AllZeroSample,
    /// Features with one value in every sample.
    ConstantFeature,
    /// Samples that repeat an earlier one.
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
    pub fn fix(self) -> &'static str {
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
    /// What it is.
    pub kind: ProblemKind,
    /// `error` breaks training; `warning` deserves a look.
    pub severity: &'static str,
    /// Samples (or, for constant features, features) affected.
    pub count: usize,
    /// The first of them, by index (at most `max_listed`).
    pub indices: Vec<usize>,
    /// What was found, in words.
    pub detail: String,
    /// What to do about it.
    pub fix: &'static str,
}

/// Statistics of one feature (one value position of a sample) over the
/// dataset; non-finite values are counted, not averaged.
#[derive(Clone, Debug, Serialize)]
pub struct FeatureStats {
    /// The feature's position in a sample.
    pub index: usize,
    /// The smallest finite value.
    #[serde(with = "crate::floats::one")]
    pub min: f64,
    /// The largest finite value.
    #[serde(with = "crate::floats::one")]
    pub max: f64,
    /// The finite values' mean.
    #[serde(with = "crate::floats::one")]
    pub mean: f64,
    /// The finite values' standard deviation.
    #[serde(with = "crate::floats::one")]
    pub std: f64,
    /// Median and interquartile range, estimated from a seeded uniform
    /// sample of the samples (`sketches.quantiles` says how exactly).
    #[serde(with = "crate::floats::one")]
    pub median: f64,
    /// The interquartile range (estimated with the median).
    #[serde(with = "crate::floats::one")]
    pub iqr: f64,
    /// NaN values.
    pub nan: usize,
    /// ±inf values.
    pub inf: usize,
}

/// Statistics of the labels.
#[derive(Clone, Debug, Serialize)]
pub struct LabelStats {
    /// The class count checked against, and where it came from.
    pub classes: Option<usize>,
    /// The smallest label.
    pub min: i64,
    /// The largest label.
    pub max: i64,
    /// Samples per label value, for labels in 0..1024.
    pub counts: Vec<usize>,
}

/// The result of a scan.
#[derive(Clone, Debug, Serialize)]
pub struct DataScan {
    /// The dataset's name or path.
    pub dataset: String,
    /// Samples scanned.
    pub samples: usize,
    /// Values per sample, and their layout.
    pub features: usize,
    /// The per-sample dimensions.
    pub dims: Vec<usize>,
    /// Bytes of values scanned (8 per value: they are scanned as f64).
    pub values: u64,
    /// What was found, by kind.
    pub problems: Vec<Problem>,
    /// Per-feature statistics.
    pub feature_stats: Vec<FeatureStats>,
    /// Label statistics, where the dataset has labels.
    pub labels: Option<LabelStats>,
    /// Samples in the robust-scale reservoir.
    pub reservoir: usize,
    /// How exact the bounded-memory estimates are.
    pub sketches: Sketches,
}

/// The error of the scan's two bounded-memory estimates.
#[derive(Clone, Debug, Serialize)]
pub struct Sketches {
    /// How exact the duplicate count is.
    pub duplicates: DuplicateSketch,
    /// How exact the medians and ranges are.
    pub quantiles: QuantileSketch,
}

/// Duplicates are found exactly while every sample's hash fits the memory
/// limit; past it, among the samples whose hash falls in a 2^-level share
/// of the hash space, and their count is scaled up.
#[derive(Clone, Debug, Serialize)]
pub struct DuplicateSketch {
    /// Every sample was compared (level 0).
    pub exact: bool,
    /// The share of distinct samples compared: 2^-level.
    #[serde(with = "crate::floats::one")]
    pub sampled: f64,
    /// Duplicates seen among the compared samples.
    pub found: u64,
    /// The estimate of all duplicates: found / sampled.
    pub estimated: u64,
    /// When sampled and some were found: the estimate's 95% relative
    /// error, 2/sqrt(found).
    pub relative_error: Option<f64>,
    /// When sampled and none were found: the count of duplicated samples
    /// that a miss rules out at 95% (3/sampled; fewer may all be missed).
    pub missed_below: Option<u64>,
    /// Samples the table can compare exactly at this memory limit.
    pub exact_up_to: usize,
}

/// Medians and interquartile ranges come from a uniform sample of
/// `samples` samples: a quantile's rank is within `rank_error` of its
/// target (95%), exact when every sample is in it.
#[derive(Clone, Debug, Serialize)]
pub struct QuantileSketch {
    /// Samples in the uniform sample.
    pub samples: usize,
    /// A quantile's rank error (95%), as a fraction of the samples.
    #[serde(with = "crate::floats::one")]
    pub rank_error: f64,
}

impl DuplicateSketch {
    fn describe(&self) -> String {
        if self.exact {
            return format!(
                "every sample compared (exact up to {} samples at this memory limit)",
                self.exact_up_to
            );
        }
        let share = format!(
            "compared the samples whose hash falls in a 1/{:.0} share of the hash space (the memory limit holds {} exactly)",
            1.0 / self.sampled,
            self.exact_up_to
        );
        match (self.relative_error, self.missed_below) {
            (Some(e), _) => format!(
                "{share}: {} found, about {} in all (±{:.0}%, 95%)",
                self.found,
                self.estimated,
                100.0 * e
            ),
            (None, Some(n)) => {
                format!("{share}: none found, so fewer than about {n} duplicated samples (95%)")
            }
            (None, None) => share,
        }
    }
}

impl DataScan {
    /// Whether anything breaks training (warnings do not count).
    pub fn has_errors(&self) -> bool {
        self.problems.iter().any(|p| p.kind.is_error())
    }

    /// The problem of this kind, if one was found.
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

    /// The scan as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a scan always serializes")
    }

    /// The scan as Markdown.
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
            "## Sketches\n\nDuplicates: {}.\n\nQuantiles: {}.\n",
            self.sketches.duplicates.describe(),
            if self.sketches.quantiles.rank_error == 0.0 {
                format!("exact (every one of the {} samples)", self.reservoir)
            } else {
                format!(
                    "from a uniform sample of {} samples, each within ±{:.1}% in rank (95%)",
                    self.reservoir,
                    100.0 * self.sketches.quantiles.rank_error
                )
            }
        );
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
