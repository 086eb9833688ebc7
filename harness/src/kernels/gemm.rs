//! A safe wrapper over the `gemm` crate (the matrix product candle itself
//! uses on the CPU) for the kernels' row-major and transposed operands.

use super::Real;
use gemm::Parallelism;

/// A matrix view: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A row-major (rows × cols) matrix.
    pub fn rows(data: &'a [T], cols: usize) -> Self {
        Mat {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [T], cols: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: cols,
        }
    }

    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `dst (m×n, row-major) = a (m×k) · b (k×n)`, or `dst += a · b` when
/// `accumulate`. Runs on the current rayon pool's threads.
pub(crate) fn matmul<T: Real>(
    dims: (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    dst: &mut [T],
    accumulate: bool,
) {
    let n = dims.1;
    matmul_strided(dims, a, b, dst, n, accumulate, T::one());
}

/// `dst = scale · a · b` (or `dst += scale · a · b`) into an m×n block of
/// `dst` whose rows are `dst_rs` elements apart (one head's columns of a
/// (S, D) matrix, say).
pub(crate) fn matmul_strided<T: Real>(
    dims: (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    dst: &mut [T],
    dst_rs: usize,
    accumulate: bool,
    scale: T,
) {
    strided_on(build, dims, a, b, dst, dst_rs, accumulate, scale)
}

/// [`matmul_strided`] on the builds `pick` chooses per product.
#[allow(clippy::too_many_arguments)]
fn strided_on<T: Real>(
    pick: impl Fn((usize, usize, usize), &Mat<T>, &Mat<T>) -> Build,
    (m, n, k): (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    dst: &mut [T],
    dst_rs: usize,
    accumulate: bool,
    scale: T,
) {
    let dst_fits = m == 0 || n == 0 || (m - 1) * dst_rs + n <= dst.len();
    assert!(
        a.fits(m, k) && b.fits(k, n) && dst_fits && dst_rs >= n,
        "matmul operands too short"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for row in 0..m {
                dst[row * dst_rs..row * dst_rs + n]
                    .iter_mut()
                    .for_each(|d| *d = T::zero());
            }
        }
        return;
    }
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // The inner dimension in even blocks of at most K_BLOCK, each added to
    // `dst` in turn, as gemm itself splits it (see K_BLOCK).
    let blocks = k.div_ceil(K_BLOCK);
    let size = k.div_ceil(blocks);
    for (i, k0) in (0..k).step_by(size).enumerate() {
        let kk = size.min(k - k0);
        // SAFETY: `fits` bounds every element the product reads (a block
        // reads columns k0..k0 + kk of `a` and those rows of `b`, inside
        // the whole), `dst_fits` every element it writes (rows `dst_rs`
        // apart, n wide), and the three buffers do not alias (`dst` is
        // borrowed mutably).
        unsafe {
            product(
                pick((m, n, kk), &a, &b),
                (m, n, kk),
                dst.as_mut_ptr(),
                dst_rs,
                accumulate || i > 0,
                (a.data.as_ptr().add(k0 * a.cs), a.cs, a.rs),
                (b.data.as_ptr().add(k0 * b.rs), b.cs, b.rs),
                scale,
                parallelism,
            )
        }
    }
}

/// Which of gemm's builds computes a product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Build {
    /// gemm's own choice for the CPU (AVX2 and FMA, or the baseline;
    /// AVX-512 with the `avx512-gemm` feature).
    Dispatch,
    /// The AVX2 and FMA build.
    #[cfg(feature = "avx512-gemm")]
    Fma,
    /// The AVX-512 build.
    #[cfg(feature = "avx512-gemm")]
    Avx512,
}

/// The build a product takes. With the `avx512-gemm` feature on a CPU
/// with AVX-512F, gemm's general path (its microkernels tile m and n and
/// sum each element's terms in k order, whatever the vector width) runs
/// on AVX-512; its small-dimension paths, whose sums run along k in
/// vectors of the build's width — a matrix-vector product, a product of
/// at most 16×16 outputs whose right operand is stored transposed (a
/// classifier head's), k of 1 or 2 — stay on the AVX2 build. So the bits
/// are those of a CPU without AVX-512 (tested below).
fn build<T>((m, n, k): (usize, usize, usize), a: &Mat<T>, b: &Mat<T>) -> Build {
    #[cfg(feature = "avx512-gemm")]
    if super::gemm_isa() == super::VectorIsa::Avx512 {
        let horizontal = a.cs == 1 && b.rs == 1 && m * n <= 16 * 16;
        let general = k > 2 && m > 1 && n > 1 && !horizontal;
        return if general { Build::Avx512 } else { Build::Fma };
    }
    let _ = (m, n, k, a, b);
    Build::Dispatch
}

/// `dst = scale · a · b` (`+=` where `accumulate`) by `build`; `a` and
/// `b` are (pointer, column stride, row stride).
///
/// # Safety
/// The pointers bound every element an (m×k)·(k×n) product with these
/// strides reads and writes, and `dst` aliases neither operand.
#[allow(clippy::too_many_arguments)]
unsafe fn product<T: Real>(
    build: Build,
    (m, n, k): (usize, usize, usize),
    dst: *mut T,
    dst_rs: usize,
    accumulate: bool,
    (a, a_cs, a_rs): (*const T, usize, usize),
    (b, b_cs, b_rs): (*const T, usize, usize),
    scale: T,
    parallelism: Parallelism,
) {
    #[cfg(feature = "avx512-gemm")]
    {
        // As `gemm::gemm` hands a product to a build: transposed where the
        // destination's rows are longer than 1 (its microkernels prefer
        // columns), so that a build's bits are those `gemm::gemm` gives.
        let (mm, nn, d_cs, d_rs, l, l_cs, l_rs, r, r_cs, r_rs) = match dst_rs > 1 {
            true => (n, m, dst_rs, 1, b, b_rs, b_cs, a, a_rs, a_cs),
            false => (m, n, 1, dst_rs, a, a_cs, a_rs, b, b_cs, b_rs),
        };
        // A build's `gemm_basic`, as gemm's `__inject_mod` writes it: the
        // generic driver with that build's microkernels (gemm keeps the
        // per-build entry points private; their parts are public).
        macro_rules! call {
            ($krate:ident, $module:ident, $t:ident, $n:expr, $simd:ident) => {{
                use gemm_common::simd::MixedSimd;
                use $krate::microkernel::$module::$t::{H_M, H_N, H_UKR, MR_DIV_N, NR, UKR};
                gemm_common::gemm::gemm_basic_generic::<
                    _,
                    $t,
                    { $n },
                    { MR_DIV_N * $n },
                    NR,
                    MR_DIV_N,
                    H_M,
                    H_N,
                >(
                    <gemm_common::simd::$simd as MixedSimd<$t, $t, $t, $t>>::try_new()
                        .expect("the CPU has the build's instructions"),
                    mm,
                    nn,
                    k,
                    dst as *mut $t,
                    d_cs as isize,
                    d_rs as isize,
                    accumulate,
                    l as *const $t,
                    l_cs as isize,
                    l_rs as isize,
                    r as *const $t,
                    r_cs as isize,
                    r_rs as isize,
                    1.0,
                    // `T` is `$t` here (the match below).
                    *(&scale as *const T as *const $t),
                    false,
                    false,
                    false,
                    |a, b, c| a * b + c,
                    &UKR,
                    &H_UKR,
                    false,
                    parallelism,
                )
            }};
        }
        use std::any::TypeId;
        let f32_ = TypeId::of::<T>() == TypeId::of::<f32>();
        let f64_ = TypeId::of::<T>() == TypeId::of::<f64>();
        // The vector widths and instruction sets of gemm's builds
        // (`gemm_def!(f32, 2)`, `gemm_def!(f64, 1)`: 4 and 8 lanes times
        // that multiplier, on pulp's V3 and V4).
        match (build, f32_, f64_) {
            (Build::Fma, true, _) => return call!(gemm_f32, fma, f32, 8, V3),
            (Build::Avx512, true, _) => return call!(gemm_f32, avx512f, f32, 16, V4),
            (Build::Fma, _, true) => return call!(gemm_f64, fma, f64, 4, V3),
            (Build::Avx512, _, true) => return call!(gemm_f64, avx512f, f64, 8, V4),
            _ => {}
        }
    }
    let _ = build;
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        accumulate,
        a,
        a_cs as isize,
        a_rs as isize,
        b,
        b_cs as isize,
        b_rs as isize,
        T::one(),
        scale,
        false,
        false,
        false,
        parallelism,
    )
}

/// The most terms of the inner dimension one gemm call sums. gemm splits
/// k into even blocks sized by the CPU's L1 cache (512 on a 32 KB 8-way
/// L1, 1024 on a 48 KB 12-way one, never under 512) and adds each block's
/// sum to the destination in turn, so a product with k above 512 had
/// other bits on another cache. Split here first, the same way, every
/// block is one of gemm's on every cache: the bits of a 32 KB L1's
/// everywhere.
const K_BLOCK: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = crate::rng::Rng::new(seed);
        (0..len).map(|_| rng.uniform_in(-1.0, 1.0) as f32).collect()
    }

    /// The AVX-512 build's products, where it takes them, have the bits
    /// of the AVX2 build's: every shape of a grid (dimensions of one, of
    /// a vector's width and past it, k past a block), every layout of the
    /// operands, with and without accumulating.
    #[cfg(feature = "avx512-gemm")]
    #[test]
    fn every_product_has_the_bits_of_the_avx2_build() {
        if super::super::gemm_isa() != super::super::VectorIsa::Avx512 {
            eprintln!("no AVX-512 on this CPU: every product is the AVX2 build's");
            return;
        }
        let dims = [1, 2, 3, 7, 16, 17, 33, 100, 300];
        let mut compared = 0;
        for (&m, &n, &k) in grid(&dims, &dims, &[1, 2, 3, 17, 100, 513, 1100]) {
            let (a, b) = (filled(m * k, 3), filled(k * n, 4));
            let start = filled(m * n, 5);
            for (a_t, b_t, acc) in (0..8).map(|i| (i & 1 != 0, i & 2 != 0, i & 4 != 0)) {
                let am = if a_t {
                    Mat::transposed(&a, m)
                } else {
                    Mat::rows(&a, k)
                };
                let bm = if b_t {
                    Mat::transposed(&b, k)
                } else {
                    Mat::rows(&b, n)
                };
                let (mut routed, mut avx2) = (start.clone(), start.clone());
                strided_on(build, (m, n, k), am, bm, &mut routed, n, acc, 0.5);
                let fma = |_: (usize, usize, usize), _: &Mat<f32>, _: &Mat<f32>| Build::Fma;
                strided_on(fma, (m, n, k), am, bm, &mut avx2, n, acc, 0.5);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&routed),
                    bits(&avx2),
                    "{m}×{k}·{k}×{n} {a_t} {b_t} {acc}"
                );
                compared += 1;
            }
        }
        assert_eq!(compared, 9 * 9 * 7 * 8);
    }

    #[cfg(feature = "avx512-gemm")]
    fn grid<'a>(
        ms: &'a [usize],
        ns: &'a [usize],
        ks: &'a [usize],
    ) -> impl Iterator<Item = (&'a usize, &'a usize, &'a usize)> {
        ms.iter().flat_map(move |m| {
            ns.iter()
                .flat_map(move |n| ks.iter().map(move |k| (m, n, k)))
        })
    }

    #[test]
    fn a_long_inner_dimension_is_summed_in_even_blocks_of_at_most_512() {
        let (m, n, k) = (5, 7, 1100);
        let (a, b) = (filled(m * k, 1), filled(k * n, 2));
        let mut whole = vec![0f32; m * n];
        matmul(
            (m, n, k),
            Mat::rows(&a, k),
            Mat::rows(&b, n),
            &mut whole,
            false,
        );
        // Three blocks of 367, 367 and 366 terms, each a product short enough
        // to be one block of gemm's on any cache, added in order.
        let mut blocks = vec![0f32; m * n];
        for (i, (k0, kk)) in [(0, 367), (367, 367), (734, 366)].into_iter().enumerate() {
            let cols: Vec<f32> = (0..m)
                .flat_map(|r| a[r * k + k0..r * k + k0 + kk].to_vec())
                .collect();
            let rows = &b[k0 * n..(k0 + kk) * n];
            let (a_block, b_block) = (Mat::rows(&cols, kk), Mat::rows(rows, n));
            matmul((m, n, kk), a_block, b_block, &mut blocks, i > 0);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&whole), bits(&blocks));
        // And it is the product.
        for (idx, &got) in whole.iter().enumerate() {
            let (r, c) = (idx / n, idx % n);
            let want: f64 = (0..k)
                .map(|j| f64::from(a[r * k + j]) * f64::from(b[j * n + c]))
                .sum();
            assert!((f64::from(got) - want).abs() < 1e-4, "{got} {want}");
        }
    }
}
