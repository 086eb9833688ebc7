//! How a scan divides its memory limit: a chunk of samples in flight, the
//! reservoir the quantiles come from, the per-feature sums and the
//! duplicate table. None of them grows with the sample count; a sample too
//! wide for the limit is refused before anything is read. A scan on more
//! than one thread holds three chunks (one read while the next is scanned
//! and the one before absorbed) and two chunks' block sums, which the
//! shares leave room for.

use super::block::block_samples;
use super::duplicates::ENTRY_BYTES;
use crate::data::dataset::SampleShape;

/// The scan's shares of its memory limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Samples read per chunk at most: a whole number of blocks.
    pub chunk: usize,
    /// Samples per block, the unit the scan's threads share: blocks start
    /// at multiples of it in the file, whatever the chunk read.
    pub block: usize,
    /// Samples in the quantile reservoir.
    pub reservoir: usize,
    /// Distinct samples the duplicate table compares exactly.
    pub duplicates: usize,
}

/// The reservoir is capped: 2048 samples put a quantile within about
/// ±2.2% of its rank (95%), and more cost time in the final sort.
const MAX_RESERVOIR: usize = 2048;
/// Fewer samples than this would make the quantiles noise.
const MIN_RESERVOIR: usize = 16;
/// Bytes per feature: seven running sums and counts, and its statistics.
pub const FEATURE_BYTES: usize = 8 * 8 + 96;

impl Plan {
    /// Samples to read at a time on `threads` threads: two blocks each,
    /// within the chunk (small reads stay in the core's cache between the
    /// read and the scan).
    pub fn read_size(&self, threads: usize) -> usize {
        (self.block * 2 * threads.max(1)).min(self.chunk)
    }

    /// The plan for samples of `shape` under `max_bytes`; the reason when
    /// the samples are too wide for it.
    pub fn new(shape: &SampleShape, max_bytes: usize) -> Result<Plan, String> {
        let f = shape.numel().max(1);
        let sample = 8 * (f + shape.labels + shape.targets);
        let features = FEATURE_BYTES.saturating_mul(f);
        let reservoir = (max_bytes / 8 / (8 * f)).min(MAX_RESERVOIR);
        if features > max_bytes / 8 || reservoir < MIN_RESERVOIR || sample > max_bytes / 16 {
            let need = (8 * features)
                .max(8 * 8 * f * MIN_RESERVOIR)
                .max(16 * sample);
            return Err(format!(
                "its samples hold {f} values each: scanning them needs {} MiB, over the limit of {} MiB (raise --max-memory-mib)",
                need.div_ceil(1 << 20),
                max_bytes >> 20
            ));
        }
        // Half the limit for the duplicate table, in whole powers of two
        // of buckets (the table's 7/8 load, so it never regrows).
        let buckets = ((max_bytes / 2) / ENTRY_BYTES).max(16);
        let buckets = 1usize << buckets.ilog2();
        let chunk = (max_bytes / 16 / sample).clamp(1, 1 << 16);
        let block = block_samples(f).min(chunk);
        Ok(Plan {
            chunk: chunk / block * block,
            block,
            reservoir,
            duplicates: buckets / 8 * 7,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(f: usize) -> SampleShape {
        SampleShape {
            dims: vec![f],
            integer: false,
            labels: 1,
            targets: 0,
        }
    }

    #[test]
    fn the_shares_fit_the_limit() {
        let max = 64 << 20;
        for f in [1, 16, 784, 3 * 32 * 32, 20_000] {
            let p = Plan::new(&shape(f), max).unwrap();
            let used = p.chunk * 8 * (f + 1)
                + p.reservoir * 8 * f
                + p.duplicates * ENTRY_BYTES
                + FEATURE_BYTES * f;
            assert!(used <= max, "{f} features: {p:?} uses {used}");
            // On threads: two more chunks (one read, one absorbed while
            // another is scanned) and two chunks' block sums and hashes.
            let blocks = p.chunk / p.block;
            assert_eq!(p.chunk % p.block, 0);
            let partials = blocks * 8 * 8 * f + p.chunk * 8;
            let threaded = used + 2 * p.chunk * 8 * (f + 1) + 2 * partials;
            assert!(
                threaded <= max,
                "{f} features on threads: {p:?} uses {threaded}"
            );
            assert!(p.reservoir >= MIN_RESERVOIR && p.chunk >= 1);
        }
    }

    #[test]
    fn a_sample_too_wide_names_what_it_needs() {
        let e = Plan::new(&shape(1 << 22), 64 << 20).unwrap_err();
        assert!(
            e.contains("4194304 values") && e.contains("--max-memory-mib"),
            "{e}"
        );
    }
}
