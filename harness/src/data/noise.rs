//! The data's Gaussian noise, fast and bit-identical to drawing each value
//! with [`Rng::normal`].
//!
//! A batch value is `(scale·(t + noise·d) + offset) as f32` for a template
//! value t and a standard normal d = √(−2 ln u1)·cos(2π u2). libm's `ln`
//! and `cos` are most of a data batch's cost (a fifth of a CNN step), and
//! no faster formula gives their exact bits. But the value is rounded to
//! f32 at the end, and the map from d to it is monotone. So a vectorized
//! approximation d′, with a proven bound E on |d′ − d|, settles the f32
//! value whenever d′ − E and d′ + E map to the same one; only the values
//! that fall within E of an f32 rounding boundary (a few in a million) are
//! recomputed through libm. The approximations are fdlibm's polynomials,
//! within about one unit in the last place of libm, and E allows over a
//! thousand times that.

use crate::rng::{box_muller, Rng};
use std::f64::consts::TAU;

/// The affine map from a template value and a normal draw to a batch value.
#[derive(Clone, Copy, Debug)]
pub struct NoiseMap {
    /// The noise's standard deviation, relative to the template's.
    pub noise: f64,
    /// Multiplies every value.
    pub scale: f64,
    /// Added after scaling.
    pub offset: f64,
}

impl NoiseMap {
    /// The batch value, exactly as the generator has always formed it.
    #[inline(always)]
    pub fn apply(&self, t: f64, d: f64) -> f32 {
        (self.scale * (t + self.noise * d) + self.offset) as f32
    }
}

/// Reusable buffers for the uniforms of one batch row.
#[derive(Default)]
pub struct Scratch {
    u1: Vec<f64>,
    u2: Vec<f64>,
}

/// Bound on |d′ − d| per unit of √(−2 ln u1): the approximations' cosine
/// (absolute) and logarithm (relative) are within 2.3e-16 and 4e-16 of
/// libm's (tested below), and libm's own error is within an ulp.
const BOUND: f64 = 1e-12;

/// Appends `map.apply(t, d)` for every template value t, each d the next
/// standard normal of `rng`: the same bits, and the same draws in the same
/// order, as calling `rng.normal()` for each. Returns how many values were
/// recomputed through libm.
pub fn push_noisy(
    rng: &mut Rng,
    template: &[f64],
    map: NoiseMap,
    out: &mut Vec<f32>,
    scratch: &mut Scratch,
) -> usize {
    let n = template.len();
    let (u1, u2) = (&mut scratch.u1, &mut scratch.u2);
    u1.clear();
    u2.clear();
    for _ in 0..n {
        u1.push(1.0 - rng.uniform()); // (0, 1], as `normal` draws it
        u2.push(rng.uniform());
    }
    let start = out.len();
    out.resize(start + n, 0.0);
    let dst = &mut out[start..];
    approximate(u1, u2, template, map, dst);
    // NaN marks a value the approximation did not settle (or a NaN value,
    // which the exact path then reproduces).
    let mut exact = 0;
    for i in 0..n {
        if dst[i].is_nan() {
            dst[i] = map.apply(template[i], box_muller(u1[i], u2[i]));
            exact += 1;
        }
    }
    exact
}

/// The vectorized pass, compiled for AVX2 and FMA where the CPU has them
/// (the approximation's own rounding never reaches the output, so it may
/// differ between the two builds).
fn approximate(u1: &[f64], u2: &[f64], t: &[f64], map: NoiseMap, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { approximate_avx2(u1, u2, t, map, dst) };
    }
    approximate_body(u1, u2, t, map, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn approximate_avx2(u1: &[f64], u2: &[f64], t: &[f64], map: NoiseMap, dst: &mut [f32]) {
    approximate_body(u1, u2, t, map, dst)
}

#[inline(always)]
fn approximate_body(u1: &[f64], u2: &[f64], t: &[f64], map: NoiseMap, dst: &mut [f32]) {
    let n = dst.len();
    let (u1, u2, t) = (&u1[..n], &u2[..n], &t[..n]);
    for i in 0..n {
        let s = (-2.0 * ln_approx(u1[i])).sqrt();
        let d = s * cos_approx(TAU * u2[i]);
        let e = s * BOUND;
        let (lo, hi) = (map.apply(t[i], d - e), map.apply(t[i], d + e));
        // s = 0 (u1 = 1) leaves only the sign of a zero to settle: libm's.
        let settled = lo.to_bits() == hi.to_bits() && lo.is_finite() && s > 0.0;
        dst[i] = if settled { lo } else { f32::NAN };
    }
}

/// ln x for positive normal x, as fdlibm computes it: x = 2^k·m with m in
/// [√2/2, √2), and ln m from s = (m − 1)/(m + 1) by a polynomial in s².
/// Branch-free, so that the loop above vectorizes.
#[allow(clippy::excessive_precision)] // fdlibm's coefficients, verbatim
#[inline(always)]
fn ln_approx(x: f64) -> f64 {
    const LN2_HI: f64 = 6.93147180369123816490e-01;
    const LN2_LO: f64 = 1.90821492927058770002e-10;
    const LG1: f64 = 6.666666666666735130e-01;
    const LG2: f64 = 3.999999999940941908e-01;
    const LG3: f64 = 2.857142874366239149e-01;
    const LG4: f64 = 2.222219843214978396e-01;
    const LG5: f64 = 1.818357216161805012e-01;
    const LG6: f64 = 1.531383769920937332e-01;
    const LG7: f64 = 1.479819860511658591e-01;
    let bits = x.to_bits();
    // Shift the high word so that the exponent field counts from √2/2.
    let hx = ((bits >> 32) as u32).wrapping_add(0x3ff0_0000 - 0x3fe6_a09e);
    let k = (hx >> 20) as i32 - 0x3ff;
    let hm = (hx & 0x000f_ffff) + 0x3fe6_a09e;
    let m = f64::from_bits((u64::from(hm) << 32) | (bits & 0xffff_ffff));
    let f = m - 1.0;
    let hfsq = 0.5 * f * f;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (LG2 + w * (LG4 + w * LG6));
    let t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));
    let r = t2 + t1;
    let dk = f64::from(k);
    s * (hfsq + r) + dk * LN2_LO - hfsq + f + dk * LN2_HI
}

/// cos a for a in [0, 2π]: reduced by multiples of π/2 (Cody–Waite, π/2
/// in two parts, exact for the four quadrants), then fdlibm's sine and
/// cosine polynomials on [−π/4, π/4], selected without branches.
#[allow(clippy::excessive_precision)] // fdlibm's coefficients, verbatim
#[inline(always)]
fn cos_approx(a: f64) -> f64 {
    const PIO2_1: f64 = 1.57079632673412561417e+00; // first 33 bits of π/2
    const PIO2_1T: f64 = 6.07710050650619224932e-11; // π/2 − PIO2_1
    const ROUND: f64 = 6755399441055744.0; // 1.5·2^52: adding it rounds to an integer
    const C1: f64 = 4.16666666666666019037e-02;
    const C2: f64 = -1.38888888888741095749e-03;
    const C3: f64 = 2.48015872894767294178e-05;
    const C4: f64 = -2.75573143513906633035e-07;
    const C5: f64 = 2.08757232129817482790e-09;
    const C6: f64 = -1.13596475577881948265e-11;
    const S1: f64 = -1.66666666666666324348e-01;
    const S2: f64 = 8.33333333332248946124e-03;
    const S3: f64 = -1.98412698298579493134e-04;
    const S4: f64 = 2.75573137070700676789e-06;
    const S5: f64 = -2.50507602534068634195e-08;
    const S6: f64 = 1.58969099521155010221e-10;
    let big = a * std::f64::consts::FRAC_2_PI + ROUND;
    let quadrant = big.to_bits() & 3;
    let q = big - ROUND;
    let r = (a - q * PIO2_1) - q * PIO2_1T;
    let z = r * r;
    let w = z * z;
    let cr = z * (C1 + z * (C2 + z * C3)) + w * w * (C4 + z * (C5 + z * C6));
    let hz = 0.5 * z;
    let one_hz = 1.0 - hz;
    let cos_r = one_hz + (((1.0 - one_hz) - hz) + z * cr);
    let sr = S2 + z * (S3 + z * S4) + z * w * (S5 + z * S6);
    let sin_r = r + z * r * (S1 + z * sr);
    // cos(r + qπ/2) is cos r, −sin r, −cos r, sin r by quadrant.
    let v = if quadrant & 1 == 0 { cos_r } else { sin_r };
    if (quadrant + 1) & 2 != 0 {
        -v
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// max |approx − libm| over xs, in absolute terms.
    fn max_error(xs: impl Iterator<Item = f64>, f: fn(f64) -> f64, g: fn(f64) -> f64) -> f64 {
        xs.map(|x| (f(x) - g(x)).abs()).fold(0.0, f64::max)
    }

    #[test]
    fn the_approximations_are_within_about_an_ulp_of_libm_far_inside_the_bound() {
        let mut rng = Rng::new(7);
        // ln over the draws' range (0, 1] with its ends and √2/2 steps;
        // relative error, since √(−2 ln u) halves it.
        let mut us: Vec<f64> = (0..200_000).map(|_| 1.0 - rng.uniform()).collect();
        us.extend([2f64.powi(-53), 0.5, 1.0, std::f64::consts::FRAC_1_SQRT_2]);
        us.extend((1..60).map(|k| 1.0 - k as f64 * 2f64.powi(-53)));
        let ln_err = us
            .iter()
            .map(|&u| {
                let exact = u.ln();
                if exact == 0.0 {
                    ln_approx(u).abs()
                } else {
                    ((ln_approx(u) - exact) / exact).abs()
                }
            })
            .fold(0.0, f64::max);
        assert!(ln_err < 1e-16 * 4.0, "ln relative error {ln_err:e}");
        // cos over [0, 2π], with the quadrant boundaries and the doubles
        // nearest to the zeros.
        let mut xs: Vec<f64> = (0..200_000).map(|_| TAU * rng.uniform()).collect();
        for q in 0..=4 {
            let c = q as f64 * std::f64::consts::FRAC_PI_2;
            let mut x = c;
            for _ in 0..40 {
                xs.push(x);
                x = f64::from_bits(x.to_bits() + 1);
            }
            xs.push(c + std::f64::consts::FRAC_PI_4);
            xs.push((c - std::f64::consts::FRAC_PI_4).max(0.0));
        }
        let cos_err = max_error(xs.into_iter(), cos_approx, f64::cos);
        assert!(cos_err <= f64::EPSILON, "cos error {cos_err:e}");
        // The bound leaves a margin of over a thousand on both.
        assert!(BOUND > 1000.0 * f64::EPSILON.max(4e-16));
    }

    /// Every value, over maps from ordinary to pathological, has the bits of
    /// the per-value libm path, and the stream stays in step.
    #[test]
    fn noisy_values_have_the_bits_of_the_libm_path() {
        let maps = [
            (1.0, 1.0, 0.0),
            (0.5, 2.0, 0.25),
            (1e-3, -3.0, 1.0),
            (0.0, 1.0, 0.0),
            (-2.0, 1e-30, -1e10),
            (1e20, 1e30, 0.0),
            (1.0, f64::INFINITY, 0.0),
            (f64::NAN, 1.0, 0.0),
            (1.0, 0.0, f64::NEG_INFINITY),
        ];
        let mut scratch = Scratch::default();
        let (mut total, mut exact) = (0usize, 0usize);
        for (seed, &(noise, scale, offset)) in maps.iter().enumerate() {
            let map = NoiseMap {
                noise,
                scale,
                offset,
            };
            let mut trng = Rng::new(100 + seed as u64);
            for row in 0..20 {
                let len = [1, 3, 17, 4096][row % 4];
                let template: Vec<f64> = (0..len)
                    .map(|i| if i % 5 == 0 { 0.0 } else { trng.normal() })
                    .collect();
                let (mut a, mut b) = (Rng::keyed(seed as u64, "noise", row as u64), Rng::new(0));
                b.clone_from(&a);
                let mut out = vec![-1.0f32]; // appended to, not overwritten
                let redone = push_noisy(&mut a, &template, map, &mut out, &mut scratch);
                assert_eq!(out.len(), len + 1);
                for (i, (&t, &v)) in template.iter().zip(&out[1..]).enumerate() {
                    let want = map.apply(t, b.normal());
                    assert_eq!(
                        v.to_bits(),
                        want.to_bits(),
                        "map {seed}, row {row}, value {i}: {v} vs {want}"
                    );
                }
                assert_eq!(a.next_u64(), b.next_u64(), "the streams stay in step");
                if seed < 5 {
                    total += len;
                    exact += redone;
                }
            }
        }
        // The fast path settles nearly every ordinary value (a planted
        // approximation that never settles would be exact but slow).
        assert!(exact * 1000 < total, "{exact} of {total} values recomputed");
    }
}
