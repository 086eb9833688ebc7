//! Fused CPU kernels for the ops where candle's own CPU backward is slow:
//! the linear map, convolution, ReLU, GELU, 2×2 pooling, layer-norm, RMS-norm,
//! rotary embeddings, SwiGLU,
//! softmax, cross-entropy, token embeddings and learned positions, the mean over positions, attention's two products, the LSTM/GRU cells and whole LSTM,
//! GRU and tanh RNN layers.
//!
//! Each kernel is a candle custom op whose backward is another fused op, so
//! a training step stays one candle graph (the probe, tracer and localizer
//! see the same tensors as before) but the backward pass runs a handful of
//! tight loops and matrix products instead of dozens of strided candle ops.
//!
//! The model zoo calls the functions here; each picks the fused kernel for
//! f32/f64 tensors on the CPU and the reference composition of candle ops
//! (`reference`) otherwise: on CUDA (the kernels have no
//! device code) and for f16/bf16, whose rounding after every op is part of
//! what a half-precision case tests. `tests` checks every kernel against its
//! reference to a named tolerance and with the finite-difference check.
//! [`with_kernels`] or `NANHUNT_KERNELS=reference` selects the reference
//! composition everywhere (benchmarks, differential checks).

mod activation;
mod attention;
mod cell;
mod conv;
mod cross_entropy;
mod embed;
mod gemm;
mod gru;
mod kept;
mod linear;
mod lstm;
mod mean;
mod norm;
mod pool;
mod recurrent;
pub mod reference;
mod rms_norm;
mod rope;
mod softmax;
mod swiglu;
mod tanh_rnn;

pub use activation::{gelu, leaky_relu, relu, tanh, LEAKY_SLOPE};
pub use attention::{
    attention_context, attention_scores, grouped_attention_context, grouped_attention_scores,
};
pub use cell::{gru_h, gru_n, lstm_activate, lstm_c, lstm_h};
pub use conv::conv2d;
pub use cross_entropy::cross_entropy;
pub use embed::{add_positions, embedding};
pub use gru::gru_layer;
pub use linear::linear;
pub use lstm::lstm_layer;
pub use mean::mean_positions;
pub use norm::layer_norm;
pub use pool::{gelu_max_pool2x2, pool2x2, relu_max_pool2x2, PoolKind};
pub use rms_norm::rms_norm;
pub use rope::{rope, rope_heads};
pub use softmax::{causal_softmax, key_masked_softmax, softmax_last_dim};
pub use swiglu::swiglu;
pub use tanh_rnn::tanh_rnn_layer;

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, WithDType};
use std::cell::Cell;
use std::sync::OnceLock;

/// Which implementation the zoo's ops use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// Fused kernels where they apply (f32/f64 on the CPU).
    Fused,
    /// candle op compositions everywhere.
    Reference,
}

thread_local! {
    static SCOPED: Cell<Option<Kernels>> = const { Cell::new(None) };
}

/// The process default: `NANHUNT_KERNELS=reference` or fused.
fn process_default() -> Kernels {
    static DEFAULT: OnceLock<Kernels> = OnceLock::new();
    *DEFAULT.get_or_init(|| match std::env::var("NANHUNT_KERNELS").as_deref() {
        Ok("reference") => Kernels::Reference,
        _ => Kernels::Fused,
    })
}

/// The kernels the current thread's model code uses.
pub fn current() -> Kernels {
    SCOPED.with(Cell::get).unwrap_or_else(process_default)
}

/// Runs `f` with the zoo's ops on `kernels` on this thread (the model's
/// forward pass and the backward pass both run on the calling thread).
pub fn with_kernels<R>(kernels: Kernels, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Kernels>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCOPED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCOPED.with(|s| s.replace(Some(kernels))));
    f()
}

/// Which vector build the fused kernels' element loops (and the
/// optimizer's fused pass) take. Every build gives the same bits: the same
/// IEEE operations on wider lanes, reductions in the kernels' own lane
/// order (`tests` checks it for every kernel, on every build the CPU has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vectors {
    /// The widest build the CPU runs: AVX-512 (F, BW, VL) where it has
    /// it, else AVX2, else the baseline. Loops measured slower on 512-bit
    /// vectors than on 256-bit ones take AVX2 in this build too.
    Widest,
    /// At most AVX2 (256-bit vectors), even on a CPU with AVX-512.
    Avx2,
    /// The x86-64 baseline build (128-bit vectors), whatever the CPU.
    Baseline,
}

/// The instruction set a vector build runs on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorIsa {
    /// 512-bit vectors (AVX-512 F, BW and VL).
    Avx512,
    /// 256-bit vectors (AVX2).
    Avx2,
    /// The target's baseline (SSE2 on x86-64).
    Baseline,
}

impl VectorIsa {
    /// The name benches and reports print.
    pub fn name(self) -> &'static str {
        match self {
            VectorIsa::Avx512 => "avx512",
            VectorIsa::Avx2 => "avx2",
            VectorIsa::Baseline => "baseline",
        }
    }
}

impl Vectors {
    /// What this build runs on this CPU: the widest it allows that the
    /// CPU has.
    pub fn isa(self) -> VectorIsa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl");
            let avx2 = std::is_x86_feature_detected!("avx2");
            match self {
                Vectors::Widest if avx512 => VectorIsa::Avx512,
                Vectors::Widest | Vectors::Avx2 if avx2 => VectorIsa::Avx2,
                _ => VectorIsa::Baseline,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        VectorIsa::Baseline
    }
}

thread_local! {
    static VECTORS: Cell<Vectors> = const { Cell::new(Vectors::Widest) };
}

/// The vector build this thread's kernels take.
pub fn vectors() -> Vectors {
    VECTORS.with(Cell::get)
}

/// Runs `f` with this thread's kernels on the `vectors` build (tests and
/// benchmarks compare the builds on one machine).
pub fn with_vectors<R>(vectors: Vectors, f: impl FnOnce() -> R) -> R {
    struct Restore(Vectors);
    impl Drop for Restore {
        fn drop(&mut self) {
            VECTORS.with(|v| v.set(self.0));
        }
    }
    let _restore = Restore(VECTORS.with(|v| v.replace(vectors)));
    f()
}

/// How far a fused kernel may be from its reference composition: the
/// largest absolute difference over any output or gradient element,
/// relative to the largest magnitude of that tensor. f64 leaves room for
/// summation order only; f32 for summation order over a few hundred terms
/// (a 3×3×16 convolution patch, a row of 64).
pub const TOLERANCE_F64: f64 = 1e-12;
/// The largest relative difference an f32 kernel may show against its reference.
pub const TOLERANCE_F32: f64 = 1e-5;

/// The named tolerance for a dtype (`None`: no fused kernel for it).
pub fn tolerance(dtype: DType) -> Option<f64> {
    match dtype {
        DType::F64 => Some(TOLERANCE_F64),
        DType::F32 => Some(TOLERANCE_F32),
        _ => None,
    }
}

/// Whether the fused kernel applies to `t`.
pub(crate) fn fused_for(t: &Tensor) -> bool {
    current() == Kernels::Fused
        && t.device().is_cpu()
        && matches!(t.dtype(), DType::F32 | DType::F64)
}

/// The floats the kernels are written for.
pub(crate) trait Real:
    num_traits::Float
    + WithDType
    + std::ops::AddAssign
    + std::ops::MulAssign
    + std::ops::DivAssign
    + Send
    + Sync
    + 'static
{
    /// tanh, to a few ulp (libm's `tanhf` took over a third of an LSTM step).
    fn tanh_fast(self) -> Self;
    /// erf, to 4e-7 absolute in f32 (libm's `erff` took an eighth of a
    /// Transformer step, in GELU).
    fn erf_fast(self) -> Self;
    /// e^x, to 2 ulp in f32 (libm's `expf` is a call per element, and was
    /// the softmax's time).
    fn exp_fast(self) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn exp_fast(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn tanh_fast(self) -> Self {
        tanh_f32(self)
    }
    #[inline(always)]
    fn erf_fast(self) -> Self {
        erf_f32(self)
    }
}

impl Real for f64 {
    fn exp_fast(self) -> Self {
        self.exp()
    }

    fn tanh_fast(self) -> Self {
        self.tanh()
    }
    fn erf_fast(self) -> Self {
        libm::erf(self)
    }
}

/// Lanes of the reductions below: a float sum in one accumulator waits on
/// each add's latency (the compiler may not reorder it); eight independent
/// partial sums let it vectorize.
const LANES: usize = 8;

/// Σ f(i) for i in 0..n, in eight interleaved partial sums (a fixed order,
/// so results are deterministic).
#[inline(always)]
pub(crate) fn lane_sum<T: Real>(n: usize, f: impl Fn(usize) -> T) -> T {
    let mut acc = [T::zero(); LANES];
    let full = n - n % LANES;
    for base in (0..full).step_by(LANES) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a += f(base + k);
        }
    }
    for (k, i) in (full..n).enumerate() {
        acc[k] += f(i);
    }
    fold_lanes(acc)
}

/// Two sums, each in `lane_sum`'s order (its own lanes, so its bits), in
/// one pass over what they read.
#[inline(always)]
pub(crate) fn lane_sum2<T: Real>(n: usize, f: impl Fn(usize) -> (T, T)) -> (T, T) {
    let (mut a, mut b) = ([T::zero(); LANES], [T::zero(); LANES]);
    let full = n - n % LANES;
    for base in (0..full).step_by(LANES) {
        for k in 0..LANES {
            let (x, y) = f(base + k);
            a[k] += x;
            b[k] += y;
        }
    }
    for (k, i) in (full..n).enumerate() {
        let (x, y) = f(i);
        a[k] += x;
        b[k] += y;
    }
    (fold_lanes(a), fold_lanes(b))
}

/// The partial sums of the lanes added in a fixed tree.
#[inline(always)]
fn fold_lanes<T: Real>(acc: [T; LANES]) -> T {
    let half = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (half[0] + half[2]) + (half[1] + half[3])
}

/// max f(i) for i in 0..n (NaN-ignoring, -inf for n = 0) in eight
/// interleaved partial maxima: one running maximum waits on each
/// comparison (a quarter of a softmax's time). The order changes at most
/// which of +0 and -0 is returned, which `x - max` cannot tell apart.
#[inline(always)]
pub(crate) fn lane_max<T: Real>(n: usize, f: impl Fn(usize) -> T) -> T {
    let mut acc = [T::neg_infinity(); LANES];
    let full = n - n % LANES;
    for base in (0..full).step_by(LANES) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = num_traits::Float::max(*a, f(base + k));
        }
    }
    for (k, i) in (full..n).enumerate() {
        acc[k] = num_traits::Float::max(acc[k], f(i));
    }
    acc.iter()
        .fold(T::neg_infinity(), |m, &v| num_traits::Float::max(m, v))
}

/// The instruction set candle's matrix products (the `gemm` crate) run on
/// here: AVX-512 in a build with the `avx512-gemm` feature (the default),
/// on a CPU with AVX-512F; else AVX2 with FMA where the CPU has it. The
/// fused kernels' products take it only on gemm's general path, whose
/// bits are the AVX2 build's (`kernels/gemm.rs`). Unlike the fused
/// kernels' builds, the choice is made once for the process.
pub fn gemm_isa() -> VectorIsa {
    #[cfg(target_arch = "x86_64")]
    {
        if cfg!(feature = "avx512-gemm") && std::is_x86_feature_detected!("avx512f") {
            return VectorIsa::Avx512;
        }
        if std::is_x86_feature_detected!("fma") {
            return VectorIsa::Avx2;
        }
    }
    VectorIsa::Baseline
}

/// Runs `f` compiled for AVX2 where the thread's build and the CPU allow
/// it (256-bit vectors instead of the x86-64 baseline's 128-bit ones),
/// never wider: the loops that take this were measured slower on 512-bit
/// vectors (the probe's scans, the norms, the GRU, the optimizer's pass)
/// or not measured there. The results are the same bits: the same IEEE
/// operations on wider lanes, and no fused multiply-add (Rust never
/// contracts a·b + c by itself).
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if vectors().isa() != VectorIsa::Baseline {
        #[target_feature(enable = "avx2")]
        unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: `isa` names only what the CPU has, and AVX-512 implies AVX2.
        return unsafe { run(f) };
    }
    f()
}

/// Runs `f` compiled for the widest vectors the thread's build allows
/// ([`Vectors::isa`]): 512-bit ones on a CPU with AVX-512, for the loops
/// measured faster there (GELU, SwiGLU, RoPE, the softmaxes, pooling, the
/// LSTM and tanh RNN layers: docs/PERFORMANCE.md). The same bits as
/// [`wide`], for the same reasons.
#[inline(always)]
pub(crate) fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if vectors().isa() == VectorIsa::Avx512 {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
        unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: `isa` names only what the CPU has.
        return unsafe { run(f) };
    }
    wide(f)
}

/// `v` in the kernel's float type.
pub(crate) fn real<T: Real>(v: f64) -> T {
    T::from(v).expect("every f64 converts to f32 or f64")
}

/// erf(x) for f32 as Eigen's odd rational approximation (also XLA's),
/// clamped at ±4 where erf rounds to ±1: at most 4.0e-7 absolute error
/// (`tests` measures it against f64). Branch-free; NaN stays NaN.
#[allow(clippy::excessive_precision)] // the published coefficients, verbatim
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.72614225801306e-10 + 2.77068142495902e-08;
    p = p * x2 + -2.10102402082508e-06;
    p = p * x2 + -5.69250639462346e-05;
    p = p * x2 + -7.34990630326855e-04;
    p = p * x2 + -2.95459980854025e-03;
    p = p * x2 + -1.60960333262415e-02;
    let mut q = x2 * -1.45660718464996e-05 + -2.13374055278905e-04;
    q = q * x2 + -1.68282697438203e-03;
    q = q * x2 + -7.37332916720468e-03;
    q = q * x2 + -1.42647390514189e-02;
    x * (p / q)
}

/// tanh(x) for f32 as Eigen's odd rational minimax approximation p(x)/q(x)
/// of degrees 13/6 (also used by XLA and ONNX Runtime), clamped where tanh
/// is within 4.6 ulp of ±1: at most 5.8 ulp from f64 tanh (`tests`). NaN stays NaN.
#[allow(clippy::excessive_precision)] // the published coefficients, verbatim
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    const CLAMP: f32 = 7.90531110763549805;
    // Branch-free (selects, not jumps) so that loops over it vectorize;
    // plain multiply-adds because `mul_add` is a library call without +fma.
    let xc = x.clamp(-CLAMP, CLAMP); // NaN stays NaN
    let x2 = xc * xc;
    let mut p = x2 * -2.76076847742355e-16 + 2.00018790482477e-13;
    p = p * x2 + -8.60467152213735e-11;
    p = p * x2 + 5.12229709037114e-08;
    p = p * x2 + 1.48572235717979e-05;
    p = p * x2 + 6.37261928875436e-04;
    p = p * x2 + 4.89352455891786e-03;
    let mut q = x2 * 1.19825839466702e-06 + 1.18534705686654e-04;
    q = q * x2 + 2.26843463243900e-03;
    q = q * x2 + 4.89352518554385e-03;
    // p/q first: x·p would lose tiny x to underflow
    let r = xc * (p / q);
    // Beyond the clamp tanh is within 4.6 ulp of ±1 and saturates, as
    // libm's does. Written as a blend, not an early return, so that loops
    // over it vectorize; a NaN fails the comparison and stays NaN.
    let saturated = 1.0f32.copysign(x);
    if x.abs() > CLAMP {
        saturated
    } else {
        r
    }
}

/// The contiguous elements of a custom op's input.
/// e^x in f32 after Cephes' `expf`: x = n·ln 2 + r with |r| ≤ ln 2 / 2
/// (Cody–Waite, ln 2 in two parts), a degree-6 polynomial for e^r, and
/// 2^n as two exact power-of-two factors from exponent bits (so that
/// subnormal results round once). Branch-free (selects), so that loops
/// over it vectorize. e^-inf = 0, e^+inf = inf, e^NaN = NaN.
#[allow(clippy::excessive_precision)] // the published coefficients, verbatim
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_375;
    const LN2_LO: f32 = -2.121_944_400_546_905_8e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer

    // Below -104 the result is 0 (selected below): e^0 is computed there
    // instead of a subnormal e^-104, whose products take microcode assists
    // (a masked softmax's -inf keys ran at a quarter of the speed). A NaN
    // is selected below too.
    let xc = if x < -104.0 { 0.0 } else { x.min(88.8) };
    let big = xc * std::f32::consts::LOG2_E + ROUND;
    let n = big - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_150_0e-4_f32;
    p = p * r + 1.398_199_950_7e-3;
    p = p * r + 8.333_451_907_3e-3;
    p = p * r + 4.166_579_589_4e-2;
    p = p * r + 1.666_666_545_9e-1;
    p = p * r + 5.000_000_120_1e-1;
    let er = p * (r * r) + r + 1.0;
    // n in [-150, 128] sits in big's low mantissa bits; 2^n = 2^a · 2^b
    // with a, b in [-75, 64], both normal.
    let n_int = (big.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let a = n_int >> 1;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let y = er * pow2(a) * pow2(n_int - a);
    let y = if x > 88.8 { f32::INFINITY } else { y };
    let y = if x < -104.0 { 0.0 } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

pub(crate) fn slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let data = s.as_slice::<T>()?;
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("fused kernel: input is not contiguous"),
    }
}

/// A backward op's packed output: one flat tensor, split by [`unpack`].
/// The width of the rows a normalization runs over (the last dimension).
pub(crate) fn last_dim(l: &Layout, op: &str) -> Result<usize> {
    match l.dims().last() {
        Some(&d) if d > 0 => Ok(d),
        _ => candle_core::bail!("{op}: input needs a non-empty last dimension"),
    }
}

pub(crate) fn flat<T: WithDType>(data: Vec<T>) -> Result<(CpuStorage, Shape)> {
    let len = data.len();
    Ok((T::to_cpu_storage_owned(data), Shape::from(len)))
}

/// Splits a flat tensor into consecutive pieces of the given shapes (the
/// packed outputs of the fused backward ops).
pub(crate) fn unpack<const N: usize>(packed: &Tensor, shapes: [&Shape; N]) -> Result<[Tensor; N]> {
    let mut start = 0;
    let mut out = Vec::with_capacity(N);
    for shape in shapes {
        let n = shape.elem_count();
        out.push(packed.narrow(0, start, n)?.reshape(shape)?);
        start += n;
    }
    Ok(out
        .try_into()
        .unwrap_or_else(|_| unreachable!("N pieces were pushed")))
}

/// Calls `$body` with `$T` bound to the element type of `$storage`
/// (f32 or f64; other dtypes never reach a fused kernel).
macro_rules! with_real {
    ($storage:expr, $T:ident => $body:expr) => {
        match $storage {
            candle_core::CpuStorage::F32(_) => {
                #[allow(unused_imports)]
                use num_traits::{One as _, Zero as _};
                type $T = f32;
                $body
            }
            candle_core::CpuStorage::F64(_) => {
                #[allow(unused_imports)]
                use num_traits::{One as _, Zero as _};
                type $T = f64;
                $body
            }
            other => candle_core::bail!(
                "fused kernel: unsupported dtype {:?}",
                candle_core::backend::BackendStorage::dtype(other)
            ),
        }
    };
}
pub(crate) use with_real;

#[cfg(test)]
mod tests;
