//! Per-feature statistics in two steps: a block of samples sums its values
//! one vector per statistic (a sample whose values are all finite, nearly
//! every one, updates them in loops the compiler vectorizes; one with a NaN
//! or an infinity takes the careful path), and the scan merges the blocks'
//! moments in file order (Chan, Golub and LeVeque), so that its figures do
//! not depend on how many threads scanned the blocks.

use super::element::Element;
use super::report::FeatureStats;

/// A block's per-feature sums, shifted by the feature's first finite value
/// in the block so that large offsets do not cancel the variance away.
pub struct BlockColumns {
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
pub struct Flags {
    pub nan: bool,
    pub inf: bool,
    /// Its largest finite magnitude.
    pub largest: f64,
    pub zero: bool,
}

impl BlockColumns {
    pub fn new(f: usize) -> Self {
        BlockColumns {
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

    /// Whether every feature has its shift, so that an all-finite sample
    /// may take [`Self::add_finite`].
    #[inline(always)]
    pub fn ready(&self) -> bool {
        self.unshifted == 0
    }

    /// Adds all-finite samples (see [`Self::ready`]) in one pass over the
    /// sums: each feature's sums take the samples in order, so the bits are
    /// those of adding them one by one, for a quarter of the loads and
    /// stores of the sums.
    #[inline(always)]
    pub fn add_finite<T: Element>(&mut self, samples: &[&[T]]) {
        let mut quads = samples.chunks_exact(4);
        for q in &mut quads {
            self.add_four([q[0], q[1], q[2], q[3]]);
        }
        for &sample in quads.remainder() {
            self.add_one(sample);
        }
    }

    #[inline(always)]
    fn add_four<T: Element>(&mut self, [a, b, c, d]: [&[T]; 4]) {
        let f = self.sum.len();
        let (a, b, c, d) = (&a[..f], &b[..f], &c[..f], &d[..f]);
        let (shift, sum, sq) = (&self.shift[..f], &mut self.sum[..f], &mut self.sum_sq[..f]);
        let (min, max) = (&mut self.min[..f], &mut self.max[..f]);
        for j in 0..f {
            let s = shift[j];
            let values = [a[j], b[j], c[j], d[j]].map(T::wide);
            let [da, db, dc, dd] = values.map(|v| v - s);
            sum[j] = sum[j] + da + db + dc + dd;
            sq[j] = sq[j] + da * da + db * db + dc * dc + dd * dd;
            let (lo, hi) = (&mut min[j], &mut max[j]);
            for v in values {
                *lo = if v < *lo { v } else { *lo };
                *hi = if v > *hi { v } else { *hi };
            }
        }
        self.whole += 4;
    }

    #[inline(always)]
    fn add_one<T: Element>(&mut self, sample: &[T]) {
        let sums = self.sum.iter_mut().zip(self.sum_sq.iter_mut());
        for ((v, shift), (sum, sq)) in sample.iter().zip(&self.shift).zip(sums) {
            let d = v.wide() - shift;
            *sum += d;
            *sq += d * d;
        }
        for ((v, lo), hi) in sample.iter().zip(&mut self.min).zip(&mut self.max) {
            let v = v.wide();
            *lo = if v < *lo { v } else { *lo };
            *hi = if v > *hi { v } else { *hi };
        }
        self.whole += 1;
    }

    /// Adds a sample holding a NaN or an infinity, or one that comes before
    /// every feature has its shift; what it showed.
    pub fn add_careful<T: Element>(&mut self, sample: &[T]) -> Flags {
        let mut flags = Flags {
            nan: false,
            inf: false,
            largest: 0.0,
            zero: true,
        };
        for (j, v) in sample.iter().map(|v| v.wide()).enumerate() {
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
}

/// The values at the ranks of the quartiles in sorted order (the nearest
/// rank), found by selection: the elements a full sort would put there, for
/// a linear pass instead of a sort per feature.
fn quartiles(values: &mut [f64]) -> [f64; 3] {
    let n = values.len();
    if n == 0 {
        return [f64::NAN; 3];
    }
    let rank = |p: f64| ((n - 1) as f64 * p).round() as usize;
    let (r1, r2, r3) = (rank(0.25), rank(0.5), rank(0.75));
    let (low, &mut median, high) = values.select_nth_unstable_by(r2, f64::total_cmp);
    let q1 = if r1 < r2 {
        *low.select_nth_unstable_by(r1, f64::total_cmp).1
    } else {
        median
    };
    let q3 = if r3 > r2 {
        *high.select_nth_unstable_by(r3 - r2 - 1, f64::total_cmp).1
    } else {
        median
    };
    [q1, median, q3]
}

/// The scan's per-feature moments: finite count, mean and sum of squared
/// deviations, merged block by block in file order.
pub struct Columns {
    n: Vec<u64>,
    mean: Vec<f64>,
    m2: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
    nan: Vec<usize>,
    inf: Vec<usize>,
}

impl Columns {
    pub fn new(f: usize) -> Self {
        Columns {
            n: vec![0; f],
            mean: vec![0.0; f],
            m2: vec![0.0; f],
            min: vec![f64::INFINITY; f],
            max: vec![f64::NEG_INFINITY; f],
            nan: vec![0; f],
            inf: vec![0; f],
        }
    }

    /// Adds the next block's values.
    pub fn merge(&mut self, b: &BlockColumns) {
        for j in 0..self.n.len() {
            let nb = b.n[j] + b.whole;
            self.nan[j] += b.nan[j];
            self.inf[j] += b.inf[j];
            if nb == 0 {
                continue;
            }
            let (nbf, sum) = (nb as f64, b.sum[j]);
            let mean_b = b.shift[j] + sum / nbf;
            let m2_b = (b.sum_sq[j] - sum * sum / nbf).max(0.0);
            let na = self.n[j];
            let n = na + nb;
            let delta = mean_b - self.mean[j];
            self.mean[j] += delta * (nbf / n as f64);
            self.m2[j] += m2_b + delta * delta * (na as f64 * nbf / n as f64);
            self.n[j] = n;
            self.min[j] = self.min[j].min(b.min[j]);
            self.max[j] = self.max[j].max(b.max[j]);
        }
    }

    /// Feature `j`'s statistics, its median and IQR from the reservoir's
    /// finite values of it, `held` (reordered).
    pub fn stats(&self, j: usize, held: &mut [f64]) -> FeatureStats {
        let [q1, median, q3] = quartiles(held);
        let n = self.n[j];
        let (mean, std) = if n == 0 {
            (f64::NAN, f64::NAN)
        } else {
            (self.mean[j], (self.m2[j] / n as f64).sqrt())
        };
        FeatureStats {
            index: j,
            min: if n == 0 { f64::NAN } else { self.min[j] },
            max: if n == 0 { f64::NAN } else { self.max[j] },
            mean,
            std,
            median,
            iqr: q3 - q1,
            nan: self.nan[j],
            inf: self.inf[j],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_quartiles_are_the_sorted_ones() {
        let mut rng = crate::rng::Rng::keyed(2, "quartiles", 0);
        for n in [1, 2, 3, 4, 5, 8, 101, 2048] {
            let mut v: Vec<f64> = (0..n)
                .map(|_| (rng.uniform_in(-9.0, 9.0)).round())
                .collect();
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let at = |p: f64| sorted[((n - 1) as f64 * p).round() as usize];
            assert_eq!(
                quartiles(&mut v),
                [at(0.25), at(0.5), at(0.75)],
                "{n} values"
            );
        }
        assert!(quartiles(&mut []).iter().all(|q| q.is_nan()));
    }

    /// Samples added four at a time give the bits of adding them one by one.
    #[test]
    fn four_at_a_time_is_one_by_one() {
        let mut rng = crate::rng::Rng::keyed(1, "columns", 0);
        let samples: Vec<Vec<f64>> = (0..11)
            .map(|_| (0..7).map(|_| rng.uniform_in(-1e3, 1e3)).collect())
            .collect();
        let views: Vec<&[f64]> = samples.iter().map(|s| &s[..]).collect();
        let (mut four, mut one) = (BlockColumns::new(7), BlockColumns::new(7));
        four.add_careful(views[0]);
        one.add_careful(views[0]);
        four.add_finite(&views[1..]);
        for v in &views[1..] {
            one.add_finite(std::slice::from_ref(v));
        }
        let bits = |b: &BlockColumns| {
            [&b.sum, &b.sum_sq, &b.min, &b.max]
                .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        };
        assert_eq!(bits(&four), bits(&one));
        assert_eq!((four.whole, one.whole), (10, 10));
    }

    /// Blocks of any size merge to the two-pass mean and deviation, on
    /// values with a large offset and a NaN among them.
    #[test]
    fn merged_blocks_give_the_two_pass_moments() {
        let values: Vec<f64> = (0..1000)
            .map(|i| 1e9 + ((i * 7919) % 1000) as f64 * 0.001)
            .collect();
        let mean = values.iter().sum::<f64>() / 1000.0;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 1000.0;
        for block in [1, 3, 64, 1000] {
            let mut cols = Columns::new(1);
            for part in values.chunks(block) {
                let mut b = BlockColumns::new(1);
                let samples: Vec<[f64; 1]> = part.iter().map(|&v| [v]).collect();
                let (first, rest) = samples.split_first().unwrap();
                b.add_careful(first);
                b.add_finite(&rest.iter().map(|s| &s[..]).collect::<Vec<_>>());
                b.add_careful(&[f64::NAN]);
                cols.merge(&b);
            }
            let s = cols.stats(0, &mut []);
            assert!((s.mean - mean).abs() < 1e-6, "block {block}: {}", s.mean);
            assert!(
                (s.std - var.sqrt()).abs() < 1e-6,
                "block {block}: {} vs {}",
                s.std,
                var.sqrt()
            );
            assert_eq!(s.nan, 1000_usize.div_ceil(block));
        }
    }
}
