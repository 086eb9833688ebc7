//! The update rules, each written once for one value or a vector of them
//! ([`Lane`]): candle's op chain of [`crate::optim::Optimizer::update`]
//! operation by operation, every scalar factor candle's affine
//! `x · a + b` in the tensor's dtype, no multiply-add fused.

use super::lanes::Lane;
use crate::kernels::Real;
use crate::spec::OptimizerSpec;

/// Adam's two betas and their bias corrections `1 − βᵗ` at step `t`,
/// computed once a step for every parameter (two `powi` a parameter were
/// a tenth of a small model's update); the other rules read none of it.
#[derive(Clone, Copy)]
pub(in crate::optim) struct BiasCorrections {
    betas: [f64; 2],
    of: [f64; 2],
}

impl BiasCorrections {
    pub(in crate::optim) fn at(spec: &OptimizerSpec, t: i32) -> Self {
        let betas = match *spec {
            OptimizerSpec::Adam { beta1, beta2, .. }
            | OptimizerSpec::Adamw { beta1, beta2, .. } => [beta1, beta2],
            _ => [0.0; 2],
        };
        BiasCorrections {
            betas,
            of: betas.map(|beta| 1.0 - beta.powi(t)),
        }
    }
}

/// An update rule at one position, or at eight at once: written once for
/// both, so that the vectors give the values' bits.
pub(super) trait Rule<T: Real> {
    /// The states it writes, in [`crate::optim::STATE_KINDS`] order (momentum, m,
    /// v); it reads those too, except on the first step.
    const WRITES: [bool; 3];

    /// The new value of parameter `p` with gradient `g`, and the states.
    fn at<V: Lane<T>, const FIRST: bool>(&self, p: V, g: V, state: [V; 3]) -> (V, [V; 3]);
}

/// candle's affine `x · a + b` in `T`, the factors cast as candle casts them.
#[derive(Clone, Copy)]
struct Affine<T>(T, T);

impl<T: Real> Affine<T> {
    fn new(mul: f64, add: f64) -> Self {
        Affine(T::from_f64(mul), T::from_f64(add))
    }

    /// `x * f` for a tensor `x` and a number `f`.
    fn scale(f: f64) -> Self {
        Self::new(f, 0.0)
    }

    #[inline(always)]
    fn at<V: Lane<T>>(self, x: V) -> V {
        x * V::splat(self.0) + V::splat(self.1)
    }
}

/// The gradient with L2 weight decay folded in, `g + p · wd` (the gradient
/// itself when wd is 0: no op, no rounding).
#[derive(Clone, Copy)]
struct L2<T>(Option<Affine<T>>);

impl<T: Real> L2<T> {
    fn new(wd: f64) -> Self {
        L2((wd != 0.0).then(|| Affine::scale(wd)))
    }

    #[inline(always)]
    fn at<V: Lane<T>>(self, p: V, g: V) -> V {
        match self.0 {
            Some(wd) => g + wd.at(p),
            None => g,
        }
    }
}

/// `decay · s + (1 − decay) · x`; `(1 − decay) · x` on the first step.
#[derive(Clone, Copy)]
struct Ema<T> {
    keep: Affine<T>,
    take: Affine<T>,
}

impl<T: Real> Ema<T> {
    fn new(decay: f64) -> Self {
        Ema {
            keep: Affine::scale(decay),
            take: Affine::scale(1.0 - decay),
        }
    }

    #[inline(always)]
    fn at<V: Lane<T>, const FIRST: bool>(self, s: V, x: V) -> V {
        if FIRST {
            self.take.at(x)
        } else {
            self.keep.at(s) + self.take.at(x)
        }
    }
}

/// A momentum buffer: the step itself first, then `μ · buf + step`.
#[inline(always)]
fn momentum_buffer<T: Real, V: Lane<T>, const FIRST: bool>(mu: Affine<T>, buf: V, step: V) -> V {
    if FIRST {
        step
    } else {
        mu.at(buf) + step
    }
}

/// Plain SGD: `p − lr · g`.
pub(super) struct Sgd<T> {
    l2: L2<T>,
    lr: Affine<T>,
}

impl<T: Real> Sgd<T> {
    pub fn new(lr: f64, weight_decay: f64) -> Self {
        Sgd {
            l2: L2::new(weight_decay),
            lr: Affine::scale(lr),
        }
    }
}

impl<T: Real> Rule<T> for Sgd<T> {
    const WRITES: [bool; 3] = [false, false, false];

    #[inline(always)]
    fn at<V: Lane<T>, const FIRST: bool>(&self, p: V, g: V, state: [V; 3]) -> (V, [V; 3]) {
        (p - self.lr.at(self.l2.at(p, g)), state)
    }
}

/// SGD with a momentum buffer, Nesterov's or not.
pub(super) struct SgdMomentum<T> {
    sgd: Sgd<T>,
    mu: Affine<T>,
    nesterov: bool,
}

impl<T: Real> SgdMomentum<T> {
    pub fn new(sgd: Sgd<T>, momentum: f64, nesterov: bool) -> Self {
        SgdMomentum {
            sgd,
            mu: Affine::scale(momentum),
            nesterov,
        }
    }
}

impl<T: Real> Rule<T> for SgdMomentum<T> {
    const WRITES: [bool; 3] = [true, false, false];

    #[inline(always)]
    fn at<V: Lane<T>, const FIRST: bool>(&self, p: V, g: V, [mom, m, v]: [V; 3]) -> (V, [V; 3]) {
        let g = self.sgd.l2.at(p, g);
        let b = momentum_buffer::<T, V, FIRST>(self.mu, mom, g);
        let direction = if self.nesterov { g + self.mu.at(b) } else { b };
        (p - self.sgd.lr.at(direction), [b, m, v])
    }
}

/// Adam, its weight decay folded into the gradient (L2).
pub(super) struct Adam<T> {
    l2: L2<T>,
    /// AdamW's `1 − lr · wd`, applied to the parameter before the step
    /// (read by [`Decoupled`] only).
    shrink: Affine<T>,
    m_ema: Ema<T>,
    v_ema: Ema<T>,
    unbias: Affine<T>,
    plus_eps: Affine<T>,
    step: Affine<T>,
}

impl<T: Real> Adam<T> {
    pub fn new(eps: f64, lr: f64, bias: BiasCorrections, weight_decay: f64) -> Self {
        let BiasCorrections {
            betas: [beta1, beta2],
            of: [bc1, bc2],
        } = bias;
        Adam {
            l2: L2::new(weight_decay),
            shrink: Affine::scale(1.0),
            m_ema: Ema::new(beta1),
            v_ema: Ema::new(beta2),
            unbias: Affine::scale(1.0 / bc2.sqrt()),
            plus_eps: Affine::new(1.0, eps),
            step: Affine::scale(lr / bc1),
        }
    }

    /// The step from `base` (the parameter, or AdamW's shrunk one).
    #[inline(always)]
    fn from<V: Lane<T>, const FIRST: bool>(&self, base: V, p: V, g: V, s: [V; 3]) -> (V, [V; 3]) {
        let [mom, m_old, v_old] = s;
        let g = self.l2.at(p, g);
        let m = self.m_ema.at::<V, FIRST>(m_old, g);
        let v = self.v_ema.at::<V, FIRST>(v_old, g * g);
        let denom = self.plus_eps.at(self.unbias.at(v.sqrt()));
        (base - self.step.at(m / denom), [mom, m, v])
    }
}

impl<T: Real> Rule<T> for Adam<T> {
    const WRITES: [bool; 3] = [false, true, true];

    #[inline(always)]
    fn at<V: Lane<T>, const FIRST: bool>(&self, p: V, g: V, state: [V; 3]) -> (V, [V; 3]) {
        self.from::<V, FIRST>(p, p, g, state)
    }
}

/// AdamW: Adam from the parameter shrunk by its decoupled weight decay.
pub(super) struct Decoupled<T>(Adam<T>);

impl<T: Real> Decoupled<T> {
    pub fn new(eps: f64, lr: f64, bias: BiasCorrections, weight_decay: f64) -> Self {
        let mut adam = Adam::new(eps, lr, bias, 0.0);
        adam.shrink = Affine::scale(1.0 - lr * weight_decay);
        Decoupled(adam)
    }
}

impl<T: Real> Rule<T> for Decoupled<T> {
    const WRITES: [bool; 3] = Adam::<T>::WRITES;

    #[inline(always)]
    fn at<V: Lane<T>, const FIRST: bool>(&self, p: V, g: V, state: [V; 3]) -> (V, [V; 3]) {
        self.0.from::<V, FIRST>(self.0.shrink.at(p), p, g, state)
    }
}

/// RMSprop without momentum.
pub(super) struct Rmsprop<T> {
    l2: L2<T>,
    ema: Ema<T>,
    plus_eps: Affine<T>,
    /// The momentum factor (read by [`WithMomentum`] only).
    mu: Affine<T>,
    lr: Affine<T>,
}

impl<T: Real> Rmsprop<T> {
    pub fn new(lr: f64, alpha: f64, eps: f64, momentum: f64, weight_decay: f64) -> Self {
        Rmsprop {
            l2: L2::new(weight_decay),
            ema: Ema::new(alpha),
            plus_eps: Affine::new(1.0, eps),
            mu: Affine::scale(momentum),
            lr: Affine::scale(lr),
        }
    }

    /// The step `g / (√v + eps)` and the new `v`.
    #[inline(always)]
    fn step<V: Lane<T>, const FIRST: bool>(&self, p: V, g: V, v_old: V) -> (V, V) {
        let g = self.l2.at(p, g);
        let v = self.ema.at::<V, FIRST>(v_old, g * g);
        (g / self.plus_eps.at(v.sqrt()), v)
    }
}

impl<T: Real> Rule<T> for Rmsprop<T> {
    const WRITES: [bool; 3] = [false, false, true];

    #[inline(always)]
    fn at<V: Lane<T>, const FIRST: bool>(&self, p: V, g: V, [mom, m, v]: [V; 3]) -> (V, [V; 3]) {
        let (step, v) = self.step::<V, FIRST>(p, g, v);
        (p - self.lr.at(step), [mom, m, v])
    }
}

/// RMSprop with a momentum buffer of its steps.
pub(super) struct WithMomentum<T>(pub Rmsprop<T>);

impl<T: Real> Rule<T> for WithMomentum<T> {
    const WRITES: [bool; 3] = [true, false, true];

    #[inline(always)]
    fn at<V: Lane<T>, const FIRST: bool>(&self, p: V, g: V, [mom, m, v]: [V; 3]) -> (V, [V; 3]) {
        let rms = &self.0;
        let (step, v) = rms.step::<V, FIRST>(p, g, v);
        let b = momentum_buffer::<T, V, FIRST>(rms.mu, mom, step);
        (p - rms.lr.at(b), [b, m, v])
    }
}
