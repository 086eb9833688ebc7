//! Duplicated samples in bounded memory. Each sample is reduced to a
//! 64-bit hash of its values and labels; the table of hashes seen is
//! exact while it has room. When it fills, only hashes whose top `level`
//! bits are zero are kept (a 2^-level share of the distinct samples,
//! chosen by hash, so every copy of a kept sample is kept too) and the
//! duplicates among them are scaled up: an adaptive distinct sample.

use super::report::DuplicateSketch;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The table's hasher: its keys are hashes already (their top bits are
/// the sampled ones), so one multiply spreads them over the buckets.
#[derive(Default)]
struct Spread(u64);

impl Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(K0);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(K0);
    }
}

/// A sample seen: its first index and the copies after it.
struct Group {
    first: usize,
    copies: u64,
}

/// Bytes per bucket the memory plan reserves: key, group and control
/// byte, twice (a full table is thinned into a fresh one).
pub const ENTRY_BYTES: usize = 2 * (8 + 16 + 1);

pub struct Duplicates {
    capacity: usize,
    level: u32,
    seen: HashMap<u64, Group, BuildHasherDefault<Spread>>,
    /// (duplicate, original) pairs, in the order found (ascending).
    listed: Vec<(usize, usize)>,
    max_listed: usize,
}

impl Duplicates {
    /// A table of at most `capacity` distinct samples.
    pub fn new(capacity: usize, max_listed: usize) -> Self {
        let capacity = capacity.max(16);
        Duplicates {
            capacity,
            level: 0,
            seen: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            listed: Vec::new(),
            max_listed,
        }
    }

    fn keeps(&self, hash: u64) -> bool {
        self.level == 0 || hash >> (64 - self.level) == 0
    }

    /// Records sample `index` of hash `hash` (indices ascend).
    pub fn push(&mut self, hash: u64, index: usize) {
        if !self.keeps(hash) {
            return;
        }
        if let Some(g) = self.seen.get_mut(&hash) {
            g.copies += 1;
            if self.listed.len() < self.max_listed {
                self.listed.push((index, g.first));
            }
            return;
        }
        // Full: keep a smaller share of the hash space in a fresh table
        // (a table thinned in place keeps its tombstones and regrows).
        if self.seen.len() >= self.capacity {
            while self.seen.len() >= self.capacity / 2 && self.level < 63 {
                self.level += 1;
                let level = self.level;
                self.seen.retain(|&h, _| h >> (64 - level) == 0);
            }
            let old = std::mem::replace(
                &mut self.seen,
                HashMap::with_capacity_and_hasher(self.capacity, Default::default()),
            );
            self.seen.extend(old);
        }
        if self.keeps(hash) && self.seen.len() < self.capacity {
            self.seen.insert(
                hash,
                Group {
                    first: index,
                    copies: 0,
                },
            );
        }
    }

    /// The duplicates listed (duplicate, original), the count to report,
    /// and how exact it is.
    pub fn finish(&mut self) -> (Vec<(usize, usize)>, u64, DuplicateSketch) {
        let found: u64 = self.seen.values().map(|g| g.copies).sum();
        let sampled = 0.5f64.powi(self.level as i32);
        let exact = self.level == 0;
        let estimated = if exact {
            found
        } else {
            ((found as f64 / sampled).round() as u64).max(self.listed.len() as u64)
        };
        let sketch = DuplicateSketch {
            exact,
            sampled,
            found,
            estimated,
            relative_error: (!exact && found > 0).then(|| 2.0 / (found as f64).sqrt()),
            missed_below: (!exact && found == 0).then(|| (3.0 / sampled).ceil() as u64),
            exact_up_to: self.capacity,
        };
        (std::mem::take(&mut self.listed), estimated, sketch)
    }
}

const K0: u64 = 0x9E37_79B9_7F4A_7C15;
const K1: u64 = 0xC2B2_AE3D_27D4_EB4F;
const K2: u64 = 0x1656_67B1_9E37_79F9;
const K3: u64 = 0x27D4_EB2F_1656_67C5;

/// The finalizer of MurmurHash3: every input bit reaches every output bit.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// A sample's hash: its values' bits and its labels in four independent
/// lanes (so the multiplies overlap), mixed at the end. Equal samples hash
/// equal; two different ones collide with odds of about 2^-64.
#[inline(always)]
pub fn sample_hash(values: &[f64], labels: &[i64]) -> u64 {
    let mut lanes = [K0, K1, K2, K3];
    let mut quads = values.chunks_exact(4);
    for q in &mut quads {
        for (lane, v) in lanes.iter_mut().zip(q) {
            *lane = (*lane ^ v.to_bits()).wrapping_mul(K0).rotate_left(31);
        }
    }
    for (lane, v) in lanes.iter_mut().zip(quads.remainder()) {
        *lane = (*lane ^ v.to_bits()).wrapping_mul(K1).rotate_left(29);
    }
    let mut h = mix(lanes[0] ^ lanes[1].rotate_left(17))
        ^ mix(lanes[2].rotate_left(7) ^ lanes[3].rotate_left(41));
    for &y in labels {
        h = mix(h ^ (y as u64).wrapping_mul(K2));
    }
    mix(h ^ (values.len() as u64).wrapping_mul(K3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_while_the_table_has_room() {
        let mut d = Duplicates::new(64, 10);
        for i in 0..40usize {
            d.push(sample_hash(&[(i % 30) as f64], &[]), i);
        }
        let (listed, count, sketch) = d.finish();
        assert!(sketch.exact);
        assert_eq!(count, 10);
        assert_eq!(listed[0], (30, 0));
        assert_eq!(listed.len(), 10);
    }

    #[test]
    fn past_the_table_the_estimate_holds_its_stated_error() {
        // 200k samples, every tenth a copy of the one before it: 20k
        // duplicates through a table of 4096.
        let mut d = Duplicates::new(4096, 5);
        for i in 0..200_000usize {
            let value = if i % 10 == 9 { i - 1 } else { i };
            d.push(sample_hash(&[value as f64, 1.0], &[0]), i);
        }
        let (listed, count, sketch) = d.finish();
        assert!(!sketch.exact);
        assert!(sketch.found > 100, "{sketch:?}");
        let err = sketch.relative_error.unwrap();
        let off = (count as f64 - 20_000.0).abs() / 20_000.0;
        assert!(off <= err, "estimated {count}, ±{err}");
        assert!(listed.iter().all(|&(dup, orig)| dup == orig + 1));
    }

    #[test]
    fn one_sample_copied_everywhere_does_not_grow_the_table() {
        let mut d = Duplicates::new(16, 0);
        let room = d.seen.capacity();
        for i in 0..10_000usize {
            let v = if i % 2 == 0 { 0.0 } else { i as f64 };
            d.push(sample_hash(&[v], &[]), i);
            assert!(d.seen.len() <= 16);
        }
        assert_eq!(d.seen.capacity(), room, "the table never grew");
        let (_, _, sketch) = d.finish();
        assert!(!sketch.exact);
    }

    #[test]
    fn values_labels_and_lengths_all_reach_the_hash() {
        let base = sample_hash(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1]);
        assert_ne!(base, sample_hash(&[1.0, 2.0, 3.0, 4.0, 5.0], &[2]));
        assert_ne!(base, sample_hash(&[1.0, 2.0, 3.0, 4.0, 6.0], &[1]));
        assert_ne!(base, sample_hash(&[2.0, 1.0, 3.0, 4.0, 5.0], &[1]));
        assert_ne!(
            sample_hash(&[0.0; 4], &[]),
            sample_hash(&[0.0; 5], &[]),
            "a zero more is another sample"
        );
    }
}
