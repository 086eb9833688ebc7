//! The two forms a chunk's inputs take, f32 as most files store them and
//! f64 for every other dtype, so that the scan's loops run on the values
//! as read: an f32 sample is surveyed eight values to a vector and hashed
//! two values to a word, and widened to f64 only inside the sums.

use super::duplicates::{sample_hash, sample_hash_f32};

pub trait Element: Copy + Send + Sync + 'static {
    /// The value in f64 (exact for f32).
    fn wide(self) -> f64;
    /// Whether every value is finite, whether all are (±)0, and the largest
    /// magnitude (meaningful when finite).
    fn survey(sample: &[Self]) -> (bool, bool, f64);
    /// The sample's hash with its labels (see [`sample_hash`]).
    fn hash(sample: &[Self], labels: &[i64]) -> u64;
}

impl Element for f64 {
    #[inline(always)]
    fn wide(self) -> f64 {
        self
    }

    /// In four independent lanes the compiler vectorizes: v · 0 is NaN
    /// exactly for a NaN or an infinity, and the bits shifted past the sign
    /// are 0 exactly for ±0.
    #[inline(always)]
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

    #[inline(always)]
    fn hash(sample: &[f64], labels: &[i64]) -> u64 {
        sample_hash(sample, labels)
    }
}

impl Element for f32 {
    #[inline(always)]
    fn wide(self) -> f64 {
        f64::from(self)
    }

    /// One integer maximum does it all: a finite value's magnitude orders
    /// as its bits without the sign do, and NaN and ±inf have the largest
    /// bits of all (eight lanes: one 256-bit vector).
    #[inline(always)]
    fn survey(sample: &[f32]) -> (bool, bool, f64) {
        let mut top = [0u32; 8];
        let mut octets = sample.chunks_exact(8);
        for o in &mut octets {
            let o: &[f32; 8] = o.try_into().expect("eight values");
            for i in 0..8 {
                top[i] = top[i].max(o[i].to_bits() & 0x7fff_ffff);
            }
        }
        for (i, v) in octets.remainder().iter().enumerate() {
            top[i] = top[i].max(v.to_bits() & 0x7fff_ffff);
        }
        let top = top.into_iter().max().unwrap_or(0);
        let finite = top < f32::INFINITY.to_bits();
        (finite, top == 0, f64::from(f32::from_bits(top)))
    }

    #[inline(always)]
    fn hash(sample: &[f32], labels: &[i64]) -> u64 {
        sample_hash_f32(sample, labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survey_both(sample: &[f64]) -> (bool, bool, f64) {
        let narrow: Vec<f32> = sample.iter().map(|&v| v as f32).collect();
        let wide = f64::survey(sample);
        let n = f32::survey(&narrow);
        assert_eq!((n.0, n.1), (wide.0, wide.1), "{sample:?}");
        if wide.0 {
            assert_eq!(n.2, wide.2, "the largest of {sample:?}");
        }
        wide
    }

    #[test]
    fn the_survey_sees_every_lane_and_the_remainder() {
        assert_eq!(survey_both(&[0.0, -0.0, 0.0, 0.0, -0.0]), (true, true, 0.0));
        assert_eq!(survey_both(&[1.0, -7.5, 2.0, 0.0, 3.0]), (true, false, 7.5));
        let long: Vec<f64> = (0..19).map(|i| i as f64 - 12.0).collect();
        assert_eq!(survey_both(&long), (true, false, 12.0));
        // A non-finite value in a full lane and in the remainder.
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            for at in [1, 5, 9, 17] {
                let mut s = vec![0.0; 18];
                s[at] = bad;
                let (finite, zero, _) = survey_both(&s);
                assert!(!finite && !zero, "{bad} at {at}");
            }
        }
        assert_eq!(survey_both(&[]), (true, true, 0.0));
    }
}
