//! Duplicated samples in bounded memory. Each sample is reduced to a
//! 64-bit hash of its values and labels; the table of hashes seen is
//! exact while it has room. When it fills, only hashes whose top `level`
//! bits are zero are kept (a 2^-level share of the distinct samples,
//! chosen by hash, so every copy of a kept sample is kept too) and the
//! duplicates among them are scaled up: an adaptive distinct sample.

use super::report::DuplicateSketch;

/// Bytes per bucket the memory plan reserves: key, first index and copies,
/// twice (a full table is thinned into a fresh one).
pub const ENTRY_BYTES: usize = 2 * (8 + 16 + 1);

/// Four slots of the table in one cache line: a probe is one line, and
/// the lines of the next samples are fetched while this one is probed.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line {
    /// A sample's hash (0 for a free slot: a hash of 0 is stored as 1).
    keys: [u64; 4],
    /// The sample's first index.
    first: [u64; 4],
}

/// An open-addressed table of distinct samples: lines probed in turn from
/// the one the hash's low bits name (the sampling uses its top bits).
struct Table {
    lines: Vec<Line>,
    /// Copies after the first, per slot: read on a repeat and when the
    /// table is thinned, never on a new sample.
    copies: Vec<u64>,
    len: usize,
}

/// `n` default values, in huge pages where the OS gives them on request:
/// the table is probed at random, and with 4 KiB pages nearly every probe
/// of a table of many MiB also misses the TLB.
fn huge<T: Copy + Default>(n: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let (at, bytes) = (v.as_ptr() as usize, n * std::mem::size_of::<T>());
        let (from, to) = (at.next_multiple_of(HUGE), (at + bytes) / HUGE * HUGE);
        if to > from {
            // SAFETY: advice on pages of the vector's own allocation,
            // before they are first written; it changes no contents.
            unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE) };
        }
    }
    v.resize(n, T::default());
    v
}

/// Where a hash is in the table, or the free slot it would take.
enum Slot {
    Seen(usize),
    Free(usize),
}

impl Table {
    /// Room for `capacity` samples at a load of at most 7/8.
    fn new(capacity: usize) -> Self {
        let slots = (capacity * 8).div_ceil(7).next_power_of_two().max(16);
        Table {
            lines: huge(slots / 4),
            copies: huge(slots),
            len: 0,
        }
    }

    fn key(hash: u64) -> u64 {
        hash.max(1)
    }

    fn home(&self, key: u64) -> usize {
        key as usize & (self.lines.len() - 1)
    }

    /// Asks the CPU for the line `hash` is probed from.
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let line = &self.lines[self.home(Self::key(hash))];
            // SAFETY: a prefetch of memory the table owns; it reads nothing.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>((line as *const Line).cast());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = hash;
    }

    /// The table is never full (its load stays under 7/8), so a free slot
    /// ends every probe.
    fn find(&self, key: u64) -> Slot {
        let mask = self.lines.len() - 1;
        let mut at = self.home(key);
        loop {
            let line = &self.lines[at];
            for (i, &k) in line.keys.iter().enumerate() {
                if k == key {
                    return Slot::Seen(at * 4 + i);
                }
                if k == 0 {
                    return Slot::Free(at * 4 + i);
                }
            }
            at = (at + 1) & mask;
        }
    }

    fn first(&self, slot: usize) -> u64 {
        self.lines[slot / 4].first[slot % 4]
    }

    fn insert_at(&mut self, slot: usize, key: u64, first: u64, copies: u64) {
        let line = &mut self.lines[slot / 4];
        (line.keys[slot % 4], line.first[slot % 4]) = (key, first);
        // A free slot's copies are 0 already: a new sample writes one line.
        if copies > 0 {
            self.copies[slot] = copies;
        }
        self.len += 1;
    }

    /// Every sample held: (key, first index, copies).
    fn entries(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let slots = self.lines.iter().flat_map(|l| l.keys.iter().zip(&l.first));
        slots
            .zip(&self.copies)
            .filter(|((&k, _), _)| k != 0)
            .map(|((&k, &f), &c)| (k, f, c))
    }
}

pub struct Duplicates {
    capacity: usize,
    level: u32,
    seen: Table,
    /// (duplicate, original) pairs, in the order found (ascending).
    listed: Vec<(usize, usize)>,
    max_listed: usize,
}

/// How far ahead of the probe the lines are fetched.
const AHEAD: usize = 8;

impl Duplicates {
    /// A table of at most `capacity` distinct samples.
    pub fn new(capacity: usize, max_listed: usize) -> Self {
        let capacity = capacity.max(16);
        Duplicates {
            capacity,
            level: 0,
            seen: Table::new(capacity),
            listed: Vec::new(),
            max_listed,
        }
    }

    fn keeps(&self, hash: u64) -> bool {
        self.level == 0 || hash >> (64 - self.level) == 0
    }

    /// Records samples of hashes `hashes`, `index(i)` the index of the
    /// i-th (indices ascend), fetching the table's lines ahead of time:
    /// those of the next [`AHEAD`] samples the table keeps (past its room
    /// it keeps a share, and the others cost no probe and no fetch).
    pub fn push_all(&mut self, hashes: &[u64], index: impl Fn(usize) -> usize) {
        // `lead`: the next hash to look ahead at; `fetched`: kept hashes
        // fetched but not yet recorded.
        let (mut lead, mut fetched) = (0, 0);
        for (i, &h) in hashes.iter().enumerate() {
            while fetched < AHEAD && lead < hashes.len() {
                if self.keeps(hashes[lead]) {
                    self.seen.prefetch(hashes[lead]);
                    fetched += 1;
                }
                lead += 1;
            }
            if !self.keeps(h) {
                continue;
            }
            fetched -= 1;
            let level = self.level;
            self.push(h, index(i));
            if self.level != level {
                // Thinned: the lines fetched are another table's.
                (lead, fetched) = (i + 1, 0);
            }
        }
    }

    /// Records sample `index` of hash `hash` (indices ascend).
    pub fn push(&mut self, hash: u64, index: usize) {
        if !self.keeps(hash) {
            return;
        }
        let key = Table::key(hash);
        let slot = match self.seen.find(key) {
            Slot::Seen(slot) => {
                self.seen.copies[slot] += 1;
                if self.listed.len() < self.max_listed {
                    self.listed.push((index, self.seen.first(slot) as usize));
                }
                return;
            }
            Slot::Free(slot) => slot,
        };
        if self.seen.len < self.capacity {
            self.seen.insert_at(slot, key, index as u64, 0);
            return;
        }
        // Full: keep a smaller share of the hash space in a fresh table.
        let kept = |level: u32| {
            self.seen
                .entries()
                .filter(move |e| e.0 >> (64 - level) == 0)
        };
        let mut level = self.level;
        while level < 63 && (level == self.level || kept(level).count() >= self.capacity / 2) {
            level += 1;
        }
        let mut fresh = Table::new(self.capacity);
        for (k, first, copies) in kept(level) {
            if let Slot::Free(slot) = fresh.find(k) {
                fresh.insert_at(slot, k, first, copies);
            }
        }
        (self.seen, self.level) = (fresh, level);
        if self.keeps(hash) && self.seen.len < self.capacity {
            if let Slot::Free(slot) = self.seen.find(key) {
                self.seen.insert_at(slot, key, index as u64, 0);
            }
        }
    }

    /// The duplicates listed (duplicate, original), the count to report,
    /// and how exact it is.
    pub fn finish(&mut self) -> (Vec<(usize, usize)>, u64, DuplicateSketch) {
        let found: u64 = self.seen.entries().map(|e| e.2).sum();
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
        absorb(&mut lanes, [0, 1, 2, 3].map(|i| q[i].to_bits()));
    }
    let tail = quads.remainder().iter().map(|v| v.to_bits());
    finish(lanes, tail, values.len(), labels)
}

/// The hash of f32 values: two values' bits to a word, so half the
/// multiplies of [`sample_hash`] (the samples of one file are all f32 or
/// all f64, so the two kinds never need to agree).
#[inline(always)]
pub fn sample_hash_f32(values: &[f32], labels: &[i64]) -> u64 {
    let pair = |a: f32, b: f32| u64::from(a.to_bits()) | u64::from(b.to_bits()) << 32;
    let mut lanes = [K0, K1, K2, K3];
    let mut octets = values.chunks_exact(8);
    for o in &mut octets {
        absorb(&mut lanes, [0, 2, 4, 6].map(|i| pair(o[i], o[i + 1])));
    }
    let rest = octets.remainder();
    let tail = rest
        .chunks(2)
        .map(|p| pair(p[0], p.get(1).copied().unwrap_or(0.0)));
    finish(lanes, tail, values.len(), labels)
}

#[inline(always)]
fn absorb(lanes: &mut [u64; 4], words: [u64; 4]) {
    for (lane, w) in lanes.iter_mut().zip(words) {
        *lane = (*lane ^ w).wrapping_mul(K0).rotate_left(31);
    }
}

/// Takes the last words (fewer than four), mixes the lanes, the labels
/// and the value count.
#[inline(always)]
fn finish(mut lanes: [u64; 4], tail: impl Iterator<Item = u64>, len: usize, labels: &[i64]) -> u64 {
    for (lane, w) in lanes.iter_mut().zip(tail) {
        *lane = (*lane ^ w).wrapping_mul(K1).rotate_left(29);
    }
    let mut h = mix(lanes[0] ^ lanes[1].rotate_left(17))
        ^ mix(lanes[2].rotate_left(7) ^ lanes[3].rotate_left(41));
    for &y in labels {
        h = mix(h ^ (y as u64).wrapping_mul(K2));
    }
    mix(h ^ (len as u64).wrapping_mul(K3))
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

    /// Batches, with their fetches ahead and the table thinned midway,
    /// record what one push at a time records.
    #[test]
    fn a_batch_is_one_push_at_a_time() {
        let hashes: Vec<u64> = (0..50_000usize)
            .map(|i| sample_hash(&[(i % 20_000) as f64], &[]))
            .collect();
        let (mut batched, mut single) = (Duplicates::new(4096, 50), Duplicates::new(4096, 50));
        for (b, block) in hashes.chunks(777).enumerate() {
            batched.push_all(block, |i| b * 777 + i);
            for (i, &h) in block.iter().enumerate() {
                single.push(h, b * 777 + i);
            }
        }
        assert!(batched.level > 0, "the table was thinned");
        let (a, b) = (batched.finish(), single.finish());
        assert_eq!((a.0, a.1), (b.0, b.1));
        assert_eq!(format!("{:?}", a.2), format!("{:?}", b.2));
    }

    #[test]
    fn one_sample_copied_everywhere_does_not_grow_the_table() {
        let mut d = Duplicates::new(16, 0);
        let room = d.seen.lines.len();
        for i in 0..10_000usize {
            let v = if i % 2 == 0 { 0.0 } else { i as f64 };
            d.push(sample_hash(&[v], &[]), i);
            assert!(d.seen.len <= 16);
        }
        assert_eq!(d.seen.lines.len(), room, "the table never grew");
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
        let base = sample_hash_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[1]);
        assert_ne!(
            base,
            sample_hash_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[2])
        );
        assert_ne!(
            base,
            sample_hash_f32(&[2.0, 1.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[1])
        );
        assert_ne!(
            base,
            sample_hash_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.5], &[1])
        );
        assert_ne!(
            sample_hash_f32(&[1.0; 9], &[]),
            sample_hash_f32(&[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0], &[]),
            "a trailing zero is another sample"
        );
        assert_ne!(sample_hash_f32(&[0.0], &[]), sample_hash_f32(&[-0.0], &[]));
    }
}
