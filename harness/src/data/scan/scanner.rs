//! The scan's running state, fed chunks of samples in order. Per-feature
//! sums live one vector per statistic, so a sample whose values are all
//! finite (nearly every one) updates them in loops the compiler
//! vectorizes; a sample with a NaN or an infinity takes the careful path.

use super::duplicates::{sample_hash, Duplicates};
use super::memory::Plan;
use super::report::{
    DataScan, FeatureStats, LabelStats, Problem, ProblemKind, QuantileSketch, ScanOptions, Sketches,
};
use crate::data::dataset::SampleShape;
use crate::data::files::Chunk;
use crate::rng::Rng;
use std::collections::HashMap;

/// Per-feature sums, shifted by the feature's first finite value so that
/// large offsets do not cancel the variance away.
struct Columns {
    /// NaN until the feature's first finite value.
    shift: Vec<f64>,
    /// Features still without a shift.
    unshifted: usize,
    /// Finite values per feature, beyond the all-finite samples.
    n: Vec<u64>,
    /// Samples whose values were all finite: counted once for every feature.
    whole: u64,
    sum: Vec<f64>,
    sum_sq: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
    nan: Vec<usize>,
    inf: Vec<usize>,
}

/// What one sample showed.
struct Flags {
    nan: bool,
    inf: bool,
    /// Its largest finite magnitude.
    largest: f64,
    zero: bool,
}

impl Columns {
    fn new(f: usize) -> Self {
        Columns {
            shift: vec![f64::NAN; f],
            unshifted: f,
            n: vec![0; f],
            whole: 0,
            sum: vec![0.0; f],
            sum_sq: vec![0.0; f],
            min: vec![f64::INFINITY; f],
            max: vec![f64::NEG_INFINITY; f],
            nan: vec![0; f],
            inf: vec![0; f],
        }
    }

    fn add(&mut self, sample: &[f64]) -> Flags {
        let (finite, zero, largest) = survey(sample);
        if finite && self.unshifted == 0 {
            self.add_finite(sample);
            return Flags {
                nan: false,
                inf: false,
                largest,
                zero,
            };
        }
        self.add_careful(sample)
    }

    fn add_finite(&mut self, sample: &[f64]) {
        let sums = self.sum.iter_mut().zip(self.sum_sq.iter_mut());
        for ((v, shift), (sum, sq)) in sample.iter().zip(&self.shift).zip(sums) {
            let d = v - shift;
            *sum += d;
            *sq += d * d;
        }
        for ((v, lo), hi) in sample.iter().zip(&mut self.min).zip(&mut self.max) {
            *lo = if *v < *lo { *v } else { *lo };
            *hi = if *v > *hi { *v } else { *hi };
        }
        self.whole += 1;
    }

    fn add_careful(&mut self, sample: &[f64]) -> Flags {
        let mut flags = Flags {
            nan: false,
            inf: false,
            largest: 0.0,
            zero: true,
        };
        for (j, &v) in sample.iter().enumerate() {
            if v.is_nan() {
                self.nan[j] += 1;
                (flags.nan, flags.zero) = (true, false);
                continue;
            }
            if v.is_infinite() {
                self.inf[j] += 1;
                (flags.inf, flags.zero) = (true, false);
                continue;
            }
            flags.zero &= v == 0.0;
            flags.largest = flags.largest.max(v.abs());
            if self.shift[j].is_nan() {
                self.shift[j] = v;
                self.unshifted -= 1;
            }
            let d = v - self.shift[j];
            self.n[j] += 1;
            self.sum[j] += d;
            self.sum_sq[j] += d * d;
            self.min[j] = self.min[j].min(v);
            self.max[j] = self.max[j].max(v);
        }
        flags
    }

    /// Feature `j`'s statistics, its median and IQR from `sorted`.
    fn stats(&self, j: usize, sorted: &[f64]) -> FeatureStats {
        let q = |p: f64| {
            if sorted.is_empty() {
                f64::NAN
            } else {
                sorted[((sorted.len() - 1) as f64 * p).round() as usize]
            }
        };
        let n = self.n[j] + self.whole;
        let (mean, std) = if n == 0 {
            (f64::NAN, f64::NAN)
        } else {
            let m = self.sum[j] / n as f64;
            (
                self.shift[j] + m,
                (self.sum_sq[j] / n as f64 - m * m).max(0.0).sqrt(),
            )
        };
        FeatureStats {
            index: j,
            min: if n == 0 { f64::NAN } else { self.min[j] },
            max: if n == 0 { f64::NAN } else { self.max[j] },
            mean,
            std,
            median: q(0.5),
            iqr: q(0.75) - q(0.25),
            nan: self.nan[j],
            inf: self.inf[j],
        }
    }
}

/// Whether every value is finite, whether all are (±)0, and the largest
/// magnitude (meaningful when finite), in four independent lanes the
/// compiler vectorizes: v · 0 is NaN exactly for a NaN or an infinity, and
/// the bits shifted past the sign are 0 exactly for ±0.
fn survey(sample: &[f64]) -> (bool, bool, f64) {
    let mut bad = [0.0f64; 4];
    let mut big = [0.0f64; 4];
    let mut bits = [0u64; 4];
    let mut quads = sample.chunks_exact(4);
    for q in &mut quads {
        for i in 0..4 {
            let v = q[i];
            bad[i] += v * 0.0;
            let a = v.abs();
            big[i] = if a > big[i] { a } else { big[i] };
            bits[i] |= v.to_bits() << 1;
        }
    }
    for (i, &v) in quads.remainder().iter().enumerate() {
        bad[i] += v * 0.0;
        big[i] = if v.abs() > big[i] { v.abs() } else { big[i] };
        bits[i] |= v.to_bits() << 1;
    }
    let finite = bad.iter().all(|&b| b == 0.0);
    let zero = bits.iter().all(|&b| b == 0);
    let largest = big.iter().fold(0.0f64, |m, &b| m.max(b));
    (finite, zero, largest)
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

/// A seeded uniform sample of whole samples (algorithm R), held flat.
struct Reservoir {
    capacity: usize,
    values: Vec<f64>,
    rng: Rng,
}

impl Reservoir {
    fn offer(&mut self, sample: &[f64], position: usize) {
        let f = sample.len();
        if self.values.len() < self.capacity * f {
            self.values.extend_from_slice(sample);
            return;
        }
        let j = self.rng.below(position + 1);
        if j < self.capacity {
            self.values[j * f..(j + 1) * f].copy_from_slice(sample);
        }
    }
}

/// The scan's running state: fed chunks of samples, in order.
pub struct Scanner {
    opts: ScanOptions,
    shape: SampleShape,
    next: usize,
    values: u64,
    columns: Columns,
    seen: HashMap<ProblemKind, Seen>,
    extreme_max: f64,
    duplicates: Duplicates,
    labels: Option<(i64, i64, Vec<usize>)>,
    reservoir: Reservoir,
}

impl Scanner {
    /// A scan of samples of `shape` within the shares of `plan`.
    pub fn new(shape: SampleShape, opts: ScanOptions, plan: &Plan) -> Self {
        let f = shape.numel();
        Scanner {
            columns: Columns::new(f),
            duplicates: Duplicates::new(plan.duplicates, opts.max_listed),
            reservoir: Reservoir {
                capacity: plan.reservoir,
                values: Vec::with_capacity(plan.reservoir * f),
                rng: Rng::keyed(0, "scan.reservoir", 0),
            },
            shape,
            opts,
            next: 0,
            values: 0,
            seen: HashMap::new(),
            extreme_max: 0.0,
            labels: None,
        }
    }

    /// Feeds the chunk's samples (values, labels, targets as read), the
    /// next ones in the file.
    pub fn push(&mut self, chunk: &Chunk) {
        self.push_with(chunk, None)
    }

    /// Feeds samples whose dataset indices are `ids` (else the next ones).
    pub fn push_with(&mut self, chunk: &Chunk, ids: Option<&[usize]>) {
        let f = self.shape.numel();
        let l = self.shape.labels;
        let k = chunk.values.len().checked_div(f).unwrap_or(0);
        let max = self.opts.max_listed;
        for row in 0..k {
            let position = self.next + row;
            let index = ids.map_or(position, |ids| ids[row]);
            let sample = &chunk.values[row * f..(row + 1) * f];
            let flags = self.columns.add(sample);
            let extreme = flags.largest > self.opts.extreme;
            if extreme {
                self.extreme_max = self.extreme_max.max(flags.largest);
            }
            for (flag, kind) in [
                (flags.nan, ProblemKind::Nan),
                (flags.inf, ProblemKind::Inf),
                (extreme, ProblemKind::Extreme),
                (flags.zero && f > 0, ProblemKind::AllZeroSample),
            ] {
                if flag {
                    self.seen.entry(kind).or_default().add(index, max);
                }
            }
            let labels = &chunk.labels[row * l..(row + 1) * l];
            if self.add_labels(labels) {
                self.seen
                    .entry(ProblemKind::LabelOutOfRange)
                    .or_default()
                    .add(index, max);
            }
            self.duplicates.push(sample_hash(sample, labels), index);
            self.reservoir.offer(sample, position);
        }
        self.next += k;
        self.values += (k * f) as u64;
    }

    /// Counts a sample's labels; whether one is out of range.
    fn add_labels(&mut self, labels: &[i64]) -> bool {
        let mut bad = false;
        for &y in labels {
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
            bad |= y < 0 || self.opts.classes.is_some_and(|c| y >= c as i64);
        }
        bad
    }

    /// Every feature's statistics, the quantiles from the reservoir (one
    /// feature's column at a time).
    fn feature_stats(&self) -> Vec<FeatureStats> {
        let f = self.shape.numel();
        let mut column = Vec::new();
        (0..f)
            .map(|j| {
                column.clear();
                let held = self.reservoir.values.iter().skip(j).step_by(f.max(1));
                column.extend(held.copied().filter(|v| v.is_finite()));
                column.sort_by(f64::total_cmp);
                self.columns.stats(j, &column)
            })
            .collect()
    }

    pub fn finish(mut self, dataset: String) -> DataScan {
        let f = self.shape.numel();
        let feature_stats = self.feature_stats();
        let (listed, count, duplicate_sketch) = self.duplicates.finish();
        if count > 0 {
            self.seen.insert(
                ProblemKind::DuplicateSample,
                Seen {
                    count: count as usize,
                    indices: listed
                        .iter()
                        .map(|&(d, _)| d)
                        .take(self.opts.max_listed)
                        .collect(),
                },
            );
        }
        let samples = self.next;
        let mut order: Vec<ProblemKind> = self.seen.keys().copied().collect();
        order.sort();
        let mut problems = Vec::new();
        for kind in order {
            let seen = self.seen.remove(&kind).expect("a key of the map");
            let detail = self.detail(kind, &feature_stats, &listed);
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
        let held = self.reservoir.values.len().checked_div(f).unwrap_or(0);
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
            reservoir: held,
            sketches: Sketches {
                duplicates: duplicate_sketch,
                quantiles: QuantileSketch {
                    samples: held,
                    // 2·sqrt(p(1-p)/n) at its widest, the median.
                    rank_error: if held >= samples {
                        0.0
                    } else {
                        1.0 / (held as f64).sqrt()
                    },
                },
            },
        }
    }

    fn detail(&self, kind: ProblemKind, stats: &[FeatureStats], dups: &[(usize, usize)]) -> String {
        let f = self.shape.numel();
        match kind {
            ProblemKind::Nan | ProblemKind::Inf => {
                let (counts, what): (Vec<usize>, _) = if kind == ProblemKind::Nan {
                    (stats.iter().map(|f| f.nan).collect(), "NaN")
                } else {
                    (stats.iter().map(|f| f.inf).collect(), "±Inf")
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
                let pairs: Vec<String> = dups
                    .iter()
                    .take(5)
                    .map(|(d, o)| format!("{d} = {o}"))
                    .collect();
                format!(
                    "samples equal (values and labels) to an earlier one: {}",
                    pairs.join(", ")
                )
            }
            ProblemKind::ConstantFeature => unreachable!("features are checked apart"),
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

#[cfg(test)]
mod tests {
    use super::survey;

    #[test]
    fn the_survey_sees_every_lane_and_the_remainder() {
        assert_eq!(survey(&[0.0, -0.0, 0.0, 0.0, -0.0]), (true, true, 0.0));
        assert_eq!(survey(&[1.0, -7.5, 2.0, 0.0, 3.0]), (true, false, 7.5));
        // A non-finite value in a full lane and in the remainder.
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let (finite, zero, _) = survey(&[0.0, bad, 0.0, 0.0]);
            assert!(!finite && !zero);
            let (finite, zero, _) = survey(&[0.0, 0.0, 0.0, 0.0, 0.0, bad]);
            assert!(!finite && !zero);
        }
        assert_eq!(survey(&[]), (true, true, 0.0));
    }
}
