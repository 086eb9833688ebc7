//! What a rule computes with: one value of the kernel's float type, or
//! eight f32 in a 256-bit AVX2 vector. Both do the same IEEE operations
//! in the same order (no multiply-add is fused), so they give the same
//! bits, and a rule is written once for both.
//!
//! The vector form exists for the pass's checks. Written as plain loops,
//! the probe's sums of squares stopped LLVM from vectorizing the rule
//! they were put in. On vectors they are added in the rule's own loop,
//! in the probe's eight lanes, while the values are in registers.

use crate::kernels::Real;
use std::ops::{Add, Div, Mul, Sub};

/// A value a rule's arithmetic runs on: `T` itself or a vector of `T`.
pub(super) trait Lane<T>:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self>
{
    /// `x` in every lane.
    fn splat(x: T) -> Self;
    fn sqrt(self) -> Self;
}

impl<T: Real> Lane<T> for T {
    #[inline(always)]
    fn splat(x: T) -> Self {
        x
    }

    #[inline(always)]
    fn sqrt(self) -> Self {
        num_traits::Float::sqrt(self)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use avx2::{F32x8, Finite, SquareSums};

/// The vectors. Their operations are AVX2 and FMA instructions: a value
/// of these types is only made in code compiled for both and run where
/// the CPU has them (the pass checks before it takes this path).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Lane;
    use std::arch::x86_64::*;
    use std::ops::{Add, Div, Mul, Sub};

    /// Eight f32.
    #[derive(Clone, Copy)]
    pub(in crate::optim::fused) struct F32x8(__m256);

    /// The lanes of the probe's Σx², in f64: lanes 0–3 and 4–7.
    pub(in crate::optim::fused) struct SquareSums(__m256d, __m256d);

    /// The probe's finiteness bits of what was written, ORed: the sign bit
    /// of a lane is set once a value in it was not finite.
    pub(in crate::optim::fused) struct Finite(__m256i);

    macro_rules! binary {
        ($trait:ident, $method:ident, $op:ident) => {
            impl $trait for F32x8 {
                type Output = F32x8;
                #[inline(always)]
                fn $method(self, other: F32x8) -> F32x8 {
                    // SAFETY: see the module's note.
                    F32x8(unsafe { $op(self.0, other.0) })
                }
            }
        };
    }
    binary!(Add, add, _mm256_add_ps);
    binary!(Sub, sub, _mm256_sub_ps);
    binary!(Mul, mul, _mm256_mul_ps);
    binary!(Div, div, _mm256_div_ps);

    impl Lane<f32> for F32x8 {
        #[inline(always)]
        fn splat(x: f32) -> Self {
            // SAFETY: see the module's note.
            F32x8(unsafe { _mm256_set1_ps(x) })
        }

        #[inline(always)]
        fn sqrt(self) -> Self {
            // SAFETY: see the module's note.
            F32x8(unsafe { _mm256_sqrt_ps(self.0) })
        }
    }

    impl F32x8 {
        /// The eight values of `s` from `at`, unchecked (the checks cost
        /// more than the arithmetic of a small update).
        ///
        /// # Safety
        /// `at + 8 <= s.len()`.
        #[inline(always)]
        pub unsafe fn load(s: &[f32], at: usize) -> Self {
            debug_assert!(at + 8 <= s.len());
            F32x8(_mm256_loadu_ps(s.as_ptr().add(at)))
        }

        /// Written over the eight values of `s` from `at`, unchecked.
        ///
        /// # Safety
        /// `at + 8 <= s.len()`.
        #[inline(always)]
        pub unsafe fn store(self, s: &mut [f32], at: usize) {
            debug_assert!(at + 8 <= s.len());
            _mm256_storeu_ps(s.as_mut_ptr().add(at), self.0)
        }
    }

    impl SquareSums {
        #[inline(always)]
        pub fn new() -> Self {
            // SAFETY: see the module's note.
            unsafe { SquareSums(_mm256_setzero_pd(), _mm256_setzero_pd()) }
        }

        /// Each lane's value squared in f64 and added to its lane: the
        /// probe's `sum[k] += x · x`, four lanes an instruction. As one
        /// multiply-add, with the same bits: the square of an f32 is
        /// exact in f64 (24-bit significands, a product of at most 48
        /// bits, in range), so only the addition rounds, as it does apart.
        #[inline(always)]
        pub fn add(&mut self, x: F32x8) {
            // SAFETY: see the module's note.
            unsafe {
                let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x.0));
                let hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x.0, 1));
                self.0 = _mm256_fmadd_pd(lo, lo, self.0);
                self.1 = _mm256_fmadd_pd(hi, hi, self.1);
            }
        }

        pub fn lanes(&self) -> [f64; 8] {
            let mut out = [0.0; 8];
            // SAFETY: eight values to write; see the module's note.
            unsafe {
                _mm256_storeu_pd(out.as_mut_ptr(), self.0);
                _mm256_storeu_pd(out.as_mut_ptr().add(4), self.1);
            }
            out
        }
    }

    impl Finite {
        #[inline(always)]
        pub fn new() -> Self {
            // SAFETY: see the module's note.
            Finite(unsafe { _mm256_setzero_si256() })
        }

        /// Takes in `x`: the probe's bit test (`probe::carry_f32`), the
        /// exponent plus one step, which carries into the sign bit iff
        /// the value is not finite.
        #[inline(always)]
        pub fn add(&mut self, x: F32x8) {
            // SAFETY: see the module's note.
            unsafe {
                let bits = _mm256_castps_si256(x.0);
                let exponent = _mm256_and_si256(bits, _mm256_set1_epi32(0x7f80_0000));
                let carry = _mm256_add_epi32(exponent, _mm256_set1_epi32(0x0080_0000));
                self.0 = _mm256_or_si256(self.0, carry);
            }
        }

        /// Whether every value taken in was finite.
        pub fn all(&self) -> bool {
            // SAFETY: see the module's note.
            unsafe { _mm256_movemask_ps(_mm256_castsi256_ps(self.0)) == 0 }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{F32x8, SquareSums};

    /// The sums as the vectors add them, eight values at a time.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vector_sums(values: &[f32]) -> [f64; 8] {
        let mut sums = SquareSums::new();
        for at in (0..values.len()).step_by(8) {
            sums.add(F32x8::load(values, at));
        }
        sums.lanes()
    }

    #[test]
    fn the_multiply_add_of_squares_gives_the_bits_of_a_multiply_then_an_add() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        // The ends of f32's range (the largest squares, the subnormals'
        // shortest significands) among finite values of every exponent.
        let mut rng = crate::rng::Rng::new(7);
        let mut values = vec![
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE,
            1e-45,
            -3e-42,
            16_777_215.0,
            0.1,
            -0.0,
        ];
        while values.len() < 8 * 500 {
            let x = f32::from_bits(rng.next_u64() as u32);
            if x.is_finite() {
                values.push(x);
            }
        }
        let mut want = [0f64; 8];
        for (i, &x) in values.iter().enumerate() {
            want[i % 8] += x as f64 * x as f64;
        }
        // SAFETY: the CPU has both features; the length is a multiple of 8.
        let got = unsafe { vector_sums(&values) };
        assert_eq!(got.map(f64::to_bits), want.map(f64::to_bits));
    }
}
