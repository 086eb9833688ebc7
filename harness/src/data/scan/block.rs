//! One block of samples, scanned on its own: its columns, the problems its
//! samples show, its labels and each sample's hash. Blocks have a fixed
//! size and are merged in file order, so a scan on any number of threads
//! gives the same report as one on one thread, to the bit.

use super::columns::{BlockColumns, Flags};
use super::element::Element;
use super::report::{ProblemKind, ScanOptions};
use crate::data::files::{Chunk, Inputs};
use std::ops::Range;

/// Values per block (fewer would spend more on the merge than on the
/// scan), and never under 64 samples: a block starts and merges eight
/// per-feature vectors, as many bytes as 16 f32 samples, so 16-sample
/// blocks of wide samples doubled the scan's memory traffic.
const BLOCK_VALUES: usize = 1 << 16;
const MIN_BLOCK_SAMPLES: usize = 64;

/// Samples per block for samples of `f` values.
pub fn block_samples(f: usize) -> usize {
    (BLOCK_VALUES / f.max(1)).max(MIN_BLOCK_SAMPLES)
}

/// The problems a sample is checked for as it is scanned, in this order.
pub const SAMPLE_PROBLEMS: [ProblemKind; 5] = [
    ProblemKind::Nan,
    ProblemKind::Inf,
    ProblemKind::Extreme,
    ProblemKind::AllZeroSample,
    ProblemKind::LabelOutOfRange,
];

/// A problem's count and listed indices, as the scan goes.
#[derive(Default)]
pub struct Seen {
    pub count: usize,
    pub indices: Vec<usize>,
}

impl Seen {
    fn add(&mut self, index: usize, max: usize) {
        self.count += 1;
        if self.indices.len() < max {
            self.indices.push(index);
        }
    }

    /// Appends a later block's count and indices.
    pub fn extend(&mut self, later: Seen, max: usize) {
        self.count += later.count;
        let room = max.saturating_sub(self.indices.len());
        self.indices.extend(later.indices.into_iter().take(room));
    }
}

/// Labels seen: the smallest, the largest, and counts of those in 0..1024.
pub type Labels = Option<(i64, i64, Vec<usize>)>;

/// Adds `later`'s labels to `labels`.
pub fn merge_labels(labels: &mut Labels, later: Labels) {
    let Some((lo, hi, counts)) = later else {
        return;
    };
    let (l, h, c) = labels.get_or_insert((lo, hi, Vec::new()));
    (*l, *h) = ((*l).min(lo), (*h).max(hi));
    if c.len() < counts.len() {
        c.resize(counts.len(), 0);
    }
    for (a, b) in c.iter_mut().zip(counts) {
        *a += b;
    }
}

/// What a block of samples showed.
pub struct Block {
    pub columns: BlockColumns,
    /// Per problem of [`SAMPLE_PROBLEMS`].
    pub seen: [Seen; 5],
    /// The largest extreme magnitude (0 when none).
    pub extreme_max: f64,
    pub labels: Labels,
    /// Each sample's hash of its values and labels, in order.
    pub hashes: Vec<u64>,
}

impl Block {
    /// Scans `rows` of `chunk` (samples of `f` values and `l` labels);
    /// `index` gives a row's dataset index.
    pub fn scan(
        chunk: &Chunk,
        rows: Range<usize>,
        shape: (usize, usize),
        opts: &ScanOptions,
        index: impl Fn(usize) -> usize,
    ) -> Block {
        let labels = &chunk.labels[..];
        match chunk.inputs() {
            Inputs::Wide(values) => Self::scan_in((values, labels), rows, shape, opts, index),
            Inputs::Narrow(values) => Self::scan_in((values, labels), rows, shape, opts, index),
        }
    }

    fn scan_in<T: Element>(
        chunk: (&[T], &[i64]),
        rows: Range<usize>,
        shape: (usize, usize),
        opts: &ScanOptions,
        index: impl Fn(usize) -> usize,
    ) -> Block {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the feature `scan_wide` is compiled for.
            return unsafe { Self::scan_wide(chunk, rows, shape, opts, index) };
        }
        Self::scan_rows(chunk, rows, shape, opts, index)
    }

    /// The same scan compiled for 256-bit vectors (same bits: the same IEEE
    /// operations on wider lanes, no fused multiply-add). Its own function
    /// rather than `kernels::wide`'s closure, which is too large to be
    /// inlined into the AVX2 frame.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn scan_wide<T: Element>(
        chunk: (&[T], &[i64]),
        rows: Range<usize>,
        shape: (usize, usize),
        opts: &ScanOptions,
        index: impl Fn(usize) -> usize,
    ) -> Block {
        Self::scan_rows(chunk, rows, shape, opts, index)
    }

    /// Samples whose values are all finite wait in groups of four for their
    /// sums; any other sample first adds the waiting ones, keeping the order.
    #[inline(always)]
    fn scan_rows<T: Element>(
        (values, labels): (&[T], &[i64]),
        rows: Range<usize>,
        (f, l): (usize, usize),
        opts: &ScanOptions,
        index: impl Fn(usize) -> usize,
    ) -> Block {
        let max = opts.max_listed;
        let mut block = Block {
            columns: BlockColumns::new(f),
            seen: Default::default(),
            extreme_max: 0.0,
            labels: None,
            hashes: Vec::with_capacity(rows.len()),
        };
        let mut waiting: [&[T]; 4] = [&[]; 4];
        let mut held = 0;
        for row in rows {
            let sample = &values[row * f..(row + 1) * f];
            let labels = &labels[row * l..(row + 1) * l];
            let (finite, zero, largest) = T::survey(sample);
            let flags = if finite && block.columns.ready() {
                waiting[held] = sample;
                held += 1;
                if held == 4 {
                    block.columns.add_finite(&waiting);
                    held = 0;
                }
                Flags {
                    nan: false,
                    inf: false,
                    largest,
                    zero,
                }
            } else {
                block.columns.add_finite(&waiting[..held]);
                held = 0;
                block.columns.add_careful(sample)
            };
            let extreme = flags.largest > opts.extreme;
            if extreme {
                block.extreme_max = block.extreme_max.max(flags.largest);
            }
            let bad_label = block.add_labels(labels, opts.classes);
            let shown = [
                flags.nan,
                flags.inf,
                extreme,
                flags.zero && f > 0,
                bad_label,
            ];
            for (seen, _) in block.seen.iter_mut().zip(shown).filter(|(_, s)| *s) {
                seen.add(index(row), max);
            }
            block.hashes.push(T::hash(sample, labels));
        }
        block.columns.add_finite(&waiting[..held]);
        block
    }

    /// Counts a sample's labels; whether one is out of range.
    fn add_labels(&mut self, labels: &[i64], classes: Option<usize>) -> bool {
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
            bad |= y < 0 || classes.is_some_and(|c| y >= c as i64);
        }
        bad
    }
}
