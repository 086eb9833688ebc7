//! The scan's running state, fed chunks of samples in order. A chunk is cut
//! into fixed blocks scanned on the scan's threads (`ScanOptions::threads`)
//! and merged in file order; what needs the order itself (the duplicate
//! table, the quantile reservoir) then takes the blocks' samples one by one.

use super::block::{merge_labels, Block, Labels, Seen, SAMPLE_PROBLEMS};
use super::columns::Columns;
use super::duplicates::Duplicates;
use super::element::Element;
use super::memory::Plan;
use super::report::{
    DataScan, FeatureStats, LabelStats, Problem, ProblemKind, QuantileSketch, ScanOptions, Sketches,
};
use crate::data::dataset::SampleShape;
use crate::data::files::{Chunk, Inputs};
use crate::rng::Rng;
use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

/// A seeded uniform sample of whole samples, held flat: Li's algorithm L,
/// which draws how many samples to skip instead of a number per sample.
struct Reservoir {
    capacity: usize,
    values: Vec<f64>,
    rng: Rng,
    /// The next position that replaces a held sample, once full.
    next: usize,
    w: f64,
}

impl Reservoir {
    fn new(capacity: usize, f: usize) -> Self {
        Reservoir {
            capacity,
            values: Vec::with_capacity(capacity * f),
            rng: Rng::keyed(0, "scan.reservoir", 0),
            next: usize::MAX,
            w: 1.0,
        }
    }

    /// A uniform draw in (0, 1).
    fn open_uniform(&mut self) -> f64 {
        loop {
            let u = self.rng.uniform();
            if u > 0.0 {
                return u;
            }
        }
    }

    fn schedule(&mut self, position: usize) {
        self.w *= (self.open_uniform().ln() / self.capacity as f64).exp();
        let skip = (self.open_uniform().ln() / (-self.w).ln_1p()).floor();
        self.next = position.saturating_add(1).saturating_add(skip as usize);
    }

    /// Offers samples `rows` of `values` (samples of `f`), the first of
    /// the chunk at scan position `start`.
    fn offer_rows<T: Element>(&mut self, values: &[T], f: usize, rows: Range<usize>, start: usize) {
        for row in rows {
            self.offer(&values[row * f..(row + 1) * f], start + row);
        }
    }

    fn offer<T: Element>(&mut self, sample: &[T], position: usize) {
        let f = sample.len();
        if self.values.len() < self.capacity * f {
            self.values.extend(sample.iter().map(|v| v.wide()));
            if self.values.len() == self.capacity * f {
                self.schedule(position);
            }
            return;
        }
        if position == self.next {
            let j = self.rng.below(self.capacity);
            let held = &mut self.values[j * f..(j + 1) * f];
            for (h, v) in held.iter_mut().zip(sample) {
                *h = v.wide();
            }
            self.schedule(position);
        }
    }
}

/// Scans the blocks of a chunk, on the scan's threads where it has them.
pub struct Blocks {
    opts: ScanOptions,
    /// Values and labels per sample.
    shape: (usize, usize),
    /// Samples per block.
    per: usize,
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl Blocks {
    /// The blocks of `chunk`, whose first sample is sample `start` of the
    /// scan (`ids`: the samples' dataset indices, else their positions).
    pub fn scan(
        &self,
        chunk: &Chunk,
        start: usize,
        ids: Option<&[usize]>,
    ) -> Vec<(Range<usize>, Block)> {
        let (f, l) = self.shape;
        let k = chunk.inputs().len().checked_div(f).unwrap_or(0);
        let per = self.per;
        let ranges: Vec<_> = (0..k).step_by(per).map(|s| s..(s + per).min(k)).collect();
        let index = |row: usize| ids.map_or(start + row, |ids| ids[row]);
        let scan = |rows: &Range<usize>| {
            let block = Block::scan(chunk, rows.clone(), (f, l), &self.opts, index);
            (rows.clone(), block)
        };
        match &self.pool {
            Some(pool) => pool.install(|| ranges.par_iter().map(scan).collect()),
            None => ranges.iter().map(scan).collect(),
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
    labels: Labels,
    reservoir: Reservoir,
    /// Samples per block; every chunk but the last holds whole blocks.
    block: usize,
    /// The threads that scan blocks; none: the calling thread alone.
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl Scanner {
    /// A scan of samples of `shape` within the shares of `plan`.
    pub fn new(shape: SampleShape, opts: ScanOptions, plan: &Plan) -> Self {
        let f = shape.numel();
        // A pool that cannot start leaves the scan on this thread.
        let pool = (opts.threads > 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(opts.threads)
                    .thread_name(|i| format!("scan-{i}"))
                    .build()
                    .ok()
            })
            .flatten()
            .map(Arc::new);
        Scanner {
            columns: Columns::new(f),
            duplicates: Duplicates::new(plan.duplicates, opts.max_listed),
            reservoir: Reservoir::new(plan.reservoir, f),
            shape,
            opts,
            next: 0,
            values: 0,
            seen: HashMap::new(),
            extreme_max: 0.0,
            labels: None,
            block: plan.block,
            pool,
        }
    }

    /// The scan's threads, when it has more than one: reading the file on
    /// one of them keeps the thread count the user gave.
    pub fn pool(&self) -> Option<Arc<rayon::ThreadPool>> {
        self.pool.clone()
    }

    /// Feeds the chunk's samples (values, labels, targets as read), the
    /// next ones in the file.
    pub fn push(&mut self, chunk: &Chunk) {
        self.push_with(chunk, None)
    }

    /// Feeds samples whose dataset indices are `ids` (else the next ones).
    pub fn push_with(&mut self, chunk: &Chunk, ids: Option<&[usize]>) {
        let blocks = self.blocks().scan(chunk, self.next, ids);
        self.absorb(chunk, ids, blocks);
    }

    /// What scans a chunk's blocks, apart from the running state, so that
    /// the next chunk can be scanned while this one is absorbed.
    pub(super) fn blocks(&self) -> Blocks {
        Blocks {
            opts: self.opts.clone(),
            shape: (self.shape.numel(), self.shape.labels),
            per: self.block,
            pool: self.pool.clone(),
        }
    }

    /// Adds the next chunk's scanned blocks (from [`Blocks::scan`] at this
    /// scan's position) in file order; the duplicate table and the
    /// reservoir take its samples one by one.
    pub(super) fn absorb(
        &mut self,
        chunk: &Chunk,
        ids: Option<&[usize]>,
        blocks: Vec<(Range<usize>, Block)>,
    ) {
        let f = self.shape.numel();
        let k = chunk.inputs().len().checked_div(f).unwrap_or(0);
        let next = self.next;
        let index = |row: usize| ids.map_or(next + row, |ids| ids[row]);
        for (rows, block) in blocks {
            self.columns.merge(&block.columns);
            let max = self.opts.max_listed;
            for (kind, seen) in SAMPLE_PROBLEMS.into_iter().zip(block.seen) {
                if seen.count > 0 {
                    self.seen.entry(kind).or_default().extend(seen, max);
                }
            }
            self.extreme_max = self.extreme_max.max(block.extreme_max);
            merge_labels(&mut self.labels, block.labels);
            let first = rows.start;
            self.duplicates
                .push_all(&block.hashes, |i| index(first + i));
            match chunk.inputs() {
                Inputs::Wide(v) => self.reservoir.offer_rows(v, f, rows, next),
                Inputs::Narrow(v) => self.reservoir.offer_rows(v, f, rows, next),
            }
        }
        self.next += k;
        self.values += (k * f) as u64;
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
                self.columns.stats(j, &mut column)
            })
            .collect()
    }

    /// The result, once every block is read.
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
