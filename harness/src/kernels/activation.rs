//! ReLU, leaky ReLU, tanh and GELU as one op each way.
//!
//! candle's ReLU backward builds a comparison mask, converts it to floats
//! and multiplies (three passes and two buffers); GELU's is nine
//! element-wise ops with erf and exp recomputed. Here each is one pass
//! (GELU with a rational erf, `Real::erf_fast`).
//!
//! Gradients at 0 follow the common convention (PyTorch, TensorFlow, JAX):
//! relu'(0) = 0 and leaky'(0) = the negative slope. candle's own
//! `Tensor::relu` has slope 1 at 0; a test notices if that changes. The
//! fused and reference paths agree on NaNs: relu(NaN) = 0 (as candle's),
//! leaky(NaN) = NaN, and the gradient is the incoming gradient times the
//! slope (a NaN gradient stays NaN where x ≤ 0, as NaN·0 does).

use super::{fused_for, real, slice, widest, with_real, Real};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};

/// ReLU, fused forward and backward (relu'(0) = 0).
pub fn relu(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return super::reference::relu(x);
    }
    x.contiguous()?.apply_op1(Pointwise(Relu))
}

/// The negative slope of the built-in leaky ReLU (PyTorch's default).
pub const LEAKY_SLOPE: f64 = 0.01;

/// Leaky ReLU with slope [`LEAKY_SLOPE`] below 0.
pub fn leaky_relu(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return super::reference::leaky_relu(x, LEAKY_SLOPE);
    }
    x.contiguous()?.apply_op1(Pointwise(LeakyRelu))
}

/// tanh, with the rational f32 approximation (`Real::tanh_fast`).
pub fn tanh(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return x.tanh();
    }
    x.contiguous()?.apply_op1(Pointwise(Tanh))
}

/// GELU with the exact erf form: x·(1 + erf(x/√2))/2.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    if !fused_for(x) {
        return x.gelu_erf();
    }
    x.contiguous()?.apply_op1(Pointwise(Gelu))
}

/// An element-wise activation: its value and its slope. A type per
/// activation (not an enum matched per element), so that each op's loop
/// is compiled for one function and vectorizes. (`pool` applies one before
/// pooling, in one op.)
pub(super) trait Activation: Copy + Send + Sync + 'static {
    const NAME: &'static str;
    const GRAD_NAME: &'static str;
    fn value<T: Real>(x: T) -> T;
    fn slope<T: Real>(x: T) -> T;
}

/// No activation: pooling alone.
#[derive(Clone, Copy)]
pub(super) struct Identity;

impl Activation for Identity {
    const NAME: &'static str = "nanhunt-identity";
    const GRAD_NAME: &'static str = "nanhunt-identity-grad";

    #[inline(always)]
    fn value<T: Real>(x: T) -> T {
        x
    }

    #[inline(always)]
    fn slope<T: Real>(_: T) -> T {
        T::one()
    }
}

#[derive(Clone, Copy)]
pub(super) struct Relu;

impl Activation for Relu {
    const NAME: &'static str = "nanhunt-relu";
    const GRAD_NAME: &'static str = "nanhunt-relu-grad";

    #[inline(always)]
    fn value<T: Real>(x: T) -> T {
        if x > T::zero() {
            x
        } else {
            T::zero()
        }
    }

    /// 1 where x > 0, and 0 at 0 (the common convention; candle says 1).
    #[inline(always)]
    fn slope<T: Real>(x: T) -> T {
        if x > T::zero() {
            T::one()
        } else {
            T::zero()
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct LeakyRelu;

impl Activation for LeakyRelu {
    const NAME: &'static str = "nanhunt-leaky-relu";
    const GRAD_NAME: &'static str = "nanhunt-leaky-relu-grad";

    /// NaN stays NaN (NaN > 0 is false, and slope · NaN is NaN).
    #[inline(always)]
    fn value<T: Real>(x: T) -> T {
        if x > T::zero() {
            x
        } else {
            x * real(LEAKY_SLOPE)
        }
    }

    /// 1 where x > 0, the negative slope at and below 0.
    #[inline(always)]
    fn slope<T: Real>(x: T) -> T {
        if x > T::zero() {
            T::one()
        } else {
            real(LEAKY_SLOPE)
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct Tanh;

impl Activation for Tanh {
    const NAME: &'static str = "nanhunt-tanh";
    const GRAD_NAME: &'static str = "nanhunt-tanh-grad";

    #[inline(always)]
    fn value<T: Real>(x: T) -> T {
        x.tanh_fast()
    }

    #[inline(always)]
    fn slope<T: Real>(x: T) -> T {
        let y = x.tanh_fast();
        T::one() - y * y
    }
}

#[derive(Clone, Copy)]
pub(super) struct Gelu;

impl Activation for Gelu {
    const NAME: &'static str = "nanhunt-gelu";
    const GRAD_NAME: &'static str = "nanhunt-gelu-grad";

    #[inline(always)]
    fn value<T: Real>(x: T) -> T {
        let half: T = real(0.5);
        half * x * (T::one() + (x * real(std::f64::consts::FRAC_1_SQRT_2)).erf_fast())
    }

    /// (1 + erf(x/√2))/2 + x·φ(x), φ the standard normal density.
    #[inline(always)]
    fn slope<T: Real>(x: T) -> T {
        let half: T = real(0.5);
        let erf = (x * real(std::f64::consts::FRAC_1_SQRT_2)).erf_fast();
        let inv_sqrt_2pi: T =
            real(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
        half * (T::one() + erf) + x * inv_sqrt_2pi * (-half * x * x).exp_fast()
    }
}

/// x → activation(x).
struct Pointwise<A>(A);

impl<A: Activation> CustomOp1 for Pointwise<A> {
    fn name(&self) -> &'static str {
        A::NAME
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_real!(s, T => {
            let x = slice::<T>(s, l)?;
            // Index loops, not iterator adaptors: those are functions of
            // their own, compiled outside `widest`'s build.
            let y = widest(#[inline(always)] || {
                let mut y = vec![T::zero(); x.len()];
                for i in 0..x.len() {
                    y[i] = A::value(x[i]);
                }
                y
            });
            Ok((T::to_cpu_storage_owned(y), l.shape().clone()))
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let op = PointwiseGrad(self.0);
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// (x, grad) → grad · activation'(x).
struct PointwiseGrad<A>(A);

impl<A: Activation> CustomOp2 for PointwiseGrad<A> {
    fn name(&self) -> &'static str {
        A::GRAD_NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_real!(s1, T => {
            let (x, g) = (slice::<T>(s1, l1)?, slice::<T>(s2, l2)?);
            let dx = widest(#[inline(always)] || {
                let (x, g) = (x, &g[..x.len()]);
                let mut dx = vec![T::zero(); x.len()];
                for i in 0..x.len() {
                    dx[i] = g[i] * A::slope(x[i]);
                }
                dx
            });
            Ok((T::to_cpu_storage_owned(dx), l1.shape().clone()))
        })
    }
}
