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
            gemm::gemm(
                m,
                n,
                kk,
                dst.as_mut_ptr(),
                1,
                dst_rs as isize,
                accumulate || i > 0,
                a.data.as_ptr().add(k0 * a.cs),
                a.cs as isize,
                a.rs as isize,
                b.data.as_ptr().add(k0 * b.rs),
                b.cs as isize,
                b.rs as isize,
                T::one(),
                scale,
                false,
                false,
                false,
                parallelism,
            )
        }
    }
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
