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
    // SAFETY: `fits` bounds every element the product reads, `dst_fits`
    // every element it writes (rows `dst_rs` apart, n wide), and the three
    // buffers do not alias (`dst` is borrowed mutably).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
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
