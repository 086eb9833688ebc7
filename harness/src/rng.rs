//! The harness's own seeded random numbers.
//!
//! candle's CPU RNG cannot be seeded, so every random draw that matters
//! (weights, data, augmentation, pathologies) comes from here, keyed by the
//! case seed and a name: `Rng::keyed(seed, "data", step)`. Different names give
//! independent streams, so adding a draw in one place never shifts another.

/// xoshiro256** seeded through SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a: a stable hash of a stream name (std's hasher is not stable across releases).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The standard normal of uniforms u1 in (0, 1] and u2 in [0, 1), through
/// libm (`data::noise` reproduces its bits faster).
#[inline]
pub fn box_muller(u1: f64, u2: f64) -> f64 {
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        let mut st = seed;
        let s = [
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ];
        Rng { s }
    }

    /// An independent stream for (seed, name, index).
    pub fn keyed(seed: u64, name: &str, index: u64) -> Self {
        let mut st = seed ^ fnv1a(name.as_bytes()).rotate_left(17);
        let mixed = splitmix64(&mut st) ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
        Rng::new(mixed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform draw from [lo, hi).
    pub fn uniform_in(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in [0, n); n must be > 0.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Standard normal (Box–Muller; one value per call keeps streams simple).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]: ln never sees 0
        let u2 = self.uniform();
        box_muller(u1, u2)
    }

    /// Student-t with `nu` degrees of freedom (heavy tails for small nu).
    pub fn student_t(&mut self, nu: f64) -> f64 {
        let z = self.normal();
        let chi2: f64 = (0..nu.round().max(1.0) as usize)
            .map(|_| self.normal().powi(2))
            .sum();
        z / (chi2 / nu.round().max(1.0)).sqrt()
    }

    /// Poisson by inversion (small rates only, which is all the data needs).
    pub fn poisson(&mut self, rate: f64) -> u32 {
        let l = (-rate).exp();
        let mut k = 0u32;
        let mut p = 1.0;
        loop {
            p *= self.uniform();
            if p <= l || k > 1000 {
                return k;
            }
            k += 1;
        }
    }

    /// Gamma(shape, 1) by Marsaglia–Tsang; used for Beta draws (mixup).
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let u = self.uniform().max(f64::MIN_POSITIVE);
            return self.gamma(shape + 1.0) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// A Beta(a, b) draw.
    pub fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        if x + y == 0.0 {
            0.5
        } else {
            x / (x + y)
        }
    }

    /// Fisher–Yates shuffle of 0..n.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.below(i + 1);
            p.swap(i, j);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map(|_| Rng::keyed(7, "data", 3).next_u64())
            .collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::keyed(7, "data", 3).next_u64(),
            Rng::keyed(7, "data", 4).next_u64()
        );
        assert_ne!(
            Rng::keyed(7, "data", 3).next_u64(),
            Rng::keyed(7, "init", 3).next_u64()
        );
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = Rng::new(1);
        let xs: Vec<f64> = (0..200_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        // Standard error of the mean is 1/sqrt(2e5) ≈ 0.0022; allow 5 sigma.
        assert!(mean.abs() < 0.011, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = Rng::new(2);
        assert!((0..10_000).all(|_| r.below(7) < 7));
    }
}
