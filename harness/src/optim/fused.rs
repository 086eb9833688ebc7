//! One parameter's update as one pass on the CPU instead of a dozen candle
//! ops (each a pass, an allocation and a dispatch: on small models the
//! optimizer was a fifth of a training step).
//!
//! Each element goes through the op chain of [`super::Optimizer::update`]
//! operation by operation, rounded to the tensor's dtype where candle's op
//! rounds: a scalar factor is candle's affine `x · a + b` with `a` and `b`
//! cast to the dtype (so `x · lr` is `x · lr + 0`, which turns −0 into +0
//! as the op does), and no multiply-add is fused. The bits are the op
//! chain's (`tests` compares them on pathological values); other devices
//! and dtypes, strided tensors, and the reference kernels take the chain.

use super::{Scan, Slot};
use crate::kernels::Real;
use crate::probe::{all_finite_pair_real, all_finite_real, norm_scan_real, TensorScan};
use crate::spec::OptimizerSpec;
use candle_core::{Result, Storage, StorageRef, Tensor};
use std::ops::Range;

/// One parameter's fused update.
pub(super) struct Fused {
    /// The parameter's new values.
    pub new: Tensor,
    /// What the pass saw, where asked for.
    pub checked: Option<Checked>,
}

/// What a checked pass saw, each scan the probe's pass over the values
/// (so its bits; `max_abs` measured only where a value is not finite), run
/// while they are in cache.
pub(super) struct Checked {
    /// The gradient as the pass read it, where asked for.
    pub grad: Option<TensorScan>,
    /// The new values.
    pub param: TensorScan,
    /// The first of the state tensors it leaves (counted in
    /// [`super::STATE_KINDS`] order) that is not finite.
    pub bad_state: Option<usize>,
}

/// Adam's two betas and their bias corrections `1 − βᵗ` at step `t`,
/// computed once a step for every parameter (two `powi` a parameter were
/// a tenth of a small model's update); the other rules read none of it.
#[derive(Clone, Copy)]
pub(super) struct BiasCorrections {
    betas: [f64; 2],
    of: [f64; 2],
}

impl BiasCorrections {
    pub(super) fn at(spec: &OptimizerSpec, t: i32) -> Self {
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

/// The new parameter values, with `slot` advanced from the state in
/// `from` (where given, else its own); `None` (nothing changed) where the
/// fused pass does not apply.
pub(super) fn update(
    spec: &OptimizerSpec,
    (p, g): (&Tensor, &Tensor),
    (from, slot): (Option<&Slot>, &mut Slot),
    (lr, bias): (f64, BiasCorrections),
    check: Scan,
) -> Result<Option<Fused>> {
    let source = from.unwrap_or(slot);
    let states = [&source.momentum, &source.m, &source.v];
    let fits = |x: &Tensor| {
        x.device().is_cpu()
            && x.dtype() == p.dtype()
            && x.elem_count() == p.elem_count()
            && x.is_contiguous()
    };
    if !crate::kernels::fused_for(p)
        || !p.is_contiguous()
        || !fits(g)
        || !states.iter().all(|s| s.as_ref().is_none_or(fits))
    {
        return Ok(None);
    }
    let at = (p, g, lr, bias);
    match p.dtype() {
        candle_core::DType::F32 => apply::<f32>(spec, at, (from, slot), check),
        candle_core::DType::F64 => apply::<f64>(spec, at, (from, slot), check),
        _ => Ok(None),
    }
}

/// The pass in `T`, its outputs made tensors and the state kept.
fn apply<T: Real>(
    spec: &OptimizerSpec,
    (p, g, lr, bias): (&Tensor, &Tensor, f64, BiasCorrections),
    (from, slot): (Option<&Slot>, &mut Slot),
    check: Scan,
) -> Result<Option<Fused>> {
    let Some((
        Next {
            p: new,
            momentum,
            m,
            v,
        },
        checked,
    )) = run::<T>(spec, p, g, from.unwrap_or(slot), (lr, bias), check)?
    else {
        return Ok(None);
    };
    let states = [momentum, m, v];
    let tensor = |values| Tensor::from_vec(values, p.shape(), p.device());
    let kept = from.map(|f| [&f.momentum, &f.m, &f.v]);
    for (k, (state, values)) in [&mut slot.momentum, &mut slot.m, &mut slot.v]
        .into_iter()
        .zip(states)
        .enumerate()
    {
        match (values, kept) {
            (Some(values), _) => *state = Some(tensor(values)?),
            // A state the rule does not write is the source's as it was.
            (None, Some(kept)) => state.clone_from(kept[k]),
            (None, None) => {}
        }
    }
    Ok(Some(Fused {
        new: tensor(new)?,
        checked,
    }))
}

/// What one update writes: the parameters and the state it keeps.
struct Next<T> {
    p: Vec<T>,
    momentum: Option<Vec<T>>,
    m: Option<Vec<T>>,
    v: Option<Vec<T>>,
}

/// The slices of the inputs (read-locked for the pass) and the rule;
/// what `check` asks to be seen of what it read and wrote.
fn run<T: Real>(
    spec: &OptimizerSpec,
    p: &Tensor,
    g: &Tensor,
    slot: &Slot,
    (lr, bias): (f64, BiasCorrections),
    check: Scan,
) -> Result<Option<(Next<T>, Option<Checked>)>> {
    let (ps, pr) = locked(p);
    let (gs, gr) = locked(g);
    let [mom, m, v] = [&slot.momentum, &slot.m, &slot.v].map(|s| s.as_ref().map(locked));
    let (Some(p), Some(g), Some(mom), Some(m), Some(v)) = (
        cpu_slice(&ps, &pr),
        cpu_slice(&gs, &gr),
        state_slice(&mom),
        state_slice(&m),
        state_slice(&v),
    ) else {
        return Ok(None);
    };
    let x = Inputs { p, g, mom, m, v };
    let Some(next) = rule(spec, &x, lr, bias) else {
        return Ok(None);
    };
    // While the values are still in cache, in one wide region: on a
    // small model these checks are a few dozen values each.
    let checked = (check != Scan::Nothing).then(|| {
        crate::kernels::wide(
            #[inline(always)]
            || Checked {
                grad: (check == Scan::ReadAndWritten).then(|| norm_scan_real(&g[..p.len()])),
                param: norm_scan_real(&next.p),
                bad_state: first_bad_state(&next),
            },
        )
    });
    Ok(Some((next, checked)))
}

/// The first of the state tensors an update leaves (counted in
/// [`super::STATE_KINDS`] order) that is not finite; where it leaves two
/// (Adam's m and v, RMSprop's v and momentum), both in one loop first.
#[inline(always)]
fn first_bad_state<T: Real>(next: &Next<T>) -> Option<usize> {
    let states = || [&next.momentum, &next.m, &next.v].into_iter().flatten();
    let mut left = states();
    if let (Some(a), Some(b), None) = (left.next(), left.next(), left.next()) {
        if all_finite_pair_real(a, b) {
            return None;
        }
    }
    states().position(|s| !all_finite_real(s))
}

/// A tensor's storage, read-locked for the pass, and its element range
/// if it is contiguous.
fn locked(x: &Tensor) -> (StorageRef<'_>, Option<Range<usize>>) {
    let (storage, layout) = x.storage_and_layout();
    let range = layout.contiguous_offsets().map(|(a, b)| a..b);
    (storage, range)
}

/// A contiguous CPU tensor's values, if it is one of `T`.
fn cpu_slice<'a, T: Real>(storage: &'a Storage, range: &Option<Range<usize>>) -> Option<&'a [T]> {
    let Storage::Cpu(cpu) = storage else {
        return None;
    };
    Some(&T::cpu_storage_as_slice(cpu).ok()?[range.clone()?])
}

/// A state's values: `Some(None)` when there is no state yet, `None` when
/// it exists but cannot be read here.
fn state_slice<'a, T: Real>(
    s: &'a Option<(StorageRef<'_>, Option<Range<usize>>)>,
) -> Option<Option<&'a [T]>> {
    match s {
        None => Some(None),
        Some((storage, range)) => cpu_slice(storage, range).map(Some),
    }
}

/// One parameter's values and its optimizer state before the update
/// (`None`: no state yet).
struct Inputs<'a, T> {
    p: &'a [T],
    g: &'a [T],
    mom: Option<&'a [T]>,
    m: Option<&'a [T]>,
    v: Option<&'a [T]>,
}

/// The states a rule reads, all present (`Some(false)`) or all absent, the
/// first step (`Some(true)`); `None` for a mix (a partly restored state),
/// which the op chain handles.
fn first_step(states: &[Option<&[impl Sized]>]) -> Option<bool> {
    let present = states.iter().filter(|s| s.is_some()).count();
    match present {
        0 => Some(true),
        n if n == states.len() => Some(false),
        _ => None,
    }
}

/// The rule on 256-bit vectors where the CPU has AVX2 (the same IEEE
/// operations, the same bits); `None` where its state is a mix.
fn rule<T: Real>(
    spec: &OptimizerSpec,
    x: &Inputs<T>,
    lr: f64,
    bias: BiasCorrections,
) -> Option<Next<T>> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<T: Real>(
            spec: &OptimizerSpec,
            x: &Inputs<T>,
            lr: f64,
            bias: BiasCorrections,
        ) -> Option<Next<T>> {
            rule_of(spec, x, lr, bias)
        }
        // SAFETY: the CPU has the feature `avx2` is compiled for.
        return unsafe { avx2(spec, x, lr, bias) };
    }
    rule_of(spec, x, lr, bias)
}

/// Each rule's loop, inlined (so compiled for the caller's vectors) and
/// monomorphized for the first step or a later one (no branch per value).
#[inline(always)]
fn rule_of<T: Real>(
    spec: &OptimizerSpec,
    x: &Inputs<T>,
    lr: f64,
    bias: BiasCorrections,
) -> Option<Next<T>> {
    Some(match *spec {
        OptimizerSpec::Sgd {
            momentum,
            nesterov,
            weight_decay,
            ..
        } => {
            let sgd = Sgd {
                l2: L2::new(weight_decay),
                mu: Affine::scale(momentum),
                lr: Affine::scale(lr),
                nesterov,
            };
            // As the op chain tests it (a NaN momentum is no momentum).
            if momentum > 0.0 {
                if first_step(&[x.mom])? {
                    sgd.momentum::<true>(x)
                } else {
                    sgd.momentum::<false>(x)
                }
            } else {
                sgd.plain(x)
            }
        }
        OptimizerSpec::Adam {
            eps, weight_decay, ..
        } => {
            let adam = Adam::new(eps, lr, bias, Decay::L2(weight_decay));
            adam.run(x, first_step(&[x.m, x.v])?)
        }
        OptimizerSpec::Adamw {
            eps, weight_decay, ..
        } => {
            let adam = Adam::new(eps, lr, bias, Decay::Decoupled(weight_decay));
            adam.run(x, first_step(&[x.m, x.v])?)
        }
        OptimizerSpec::Rmsprop {
            alpha,
            eps,
            momentum,
            weight_decay,
            ..
        } => {
            let rms = Rmsprop {
                l2: L2::new(weight_decay),
                ema: Ema::new(alpha),
                plus_eps: Affine::new(1.0, eps),
                mu: (momentum > 0.0).then(|| Affine::scale(momentum)),
                lr: Affine::scale(lr),
            };
            let first = match rms.mu {
                Some(_) => first_step(&[x.v, x.mom])?,
                None => first_step(&[x.v])?,
            };
            if first {
                rms.run::<true>(x)
            } else {
                rms.run::<false>(x)
            }
        }
    })
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
    fn at(self, x: T) -> T {
        x * self.0 + self.1
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
    fn at(self, p: T, g: T) -> T {
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
    fn at<const FIRST: bool>(self, s: T, x: T) -> T {
        if FIRST {
            self.take.at(x)
        } else {
            self.keep.at(s) + self.take.at(x)
        }
    }
}

/// A momentum buffer: the step itself first, then `μ · buf + step`.
#[inline(always)]
fn momentum_buffer<T: Real, const FIRST: bool>(mu: Affine<T>, buf: T, step: T) -> T {
    if FIRST {
        step
    } else {
        mu.at(buf) + step
    }
}

/// A state's values cut to `n` (so the loops carry no bounds checks); on
/// the first step, where there is none, the parameters stand in, unread.
#[inline(always)]
fn state<'a, T, const FIRST: bool>(s: Option<&'a [T]>, stand_in: &'a [T]) -> &'a [T] {
    match s {
        Some(s) if !FIRST => &s[..stand_in.len()],
        _ => stand_in,
    }
}

struct Sgd<T> {
    l2: L2<T>,
    mu: Affine<T>,
    lr: Affine<T>,
    nesterov: bool,
}

impl<T: Real> Sgd<T> {
    #[inline(always)]
    fn plain(&self, x: &Inputs<T>) -> Next<T> {
        let g = &x.g[..x.p.len()];
        let mut new = vec![T::zero(); x.p.len()];
        for ((new, &p), &g) in new.iter_mut().zip(x.p).zip(g) {
            *new = p - self.lr.at(self.l2.at(p, g));
        }
        Next {
            p: new,
            momentum: None,
            m: None,
            v: None,
        }
    }

    #[inline(always)]
    fn momentum<const FIRST: bool>(&self, x: &Inputs<T>) -> Next<T> {
        let n = x.p.len();
        let (p, g, mom) = (x.p, &x.g[..n], state::<T, FIRST>(x.mom, x.p));
        let (mut new, mut buf) = (vec![T::zero(); n], vec![T::zero(); n]);
        for i in 0..n {
            let g = self.l2.at(p[i], g[i]);
            let b = momentum_buffer::<T, FIRST>(self.mu, mom[i], g);
            let direction = if self.nesterov { g + self.mu.at(b) } else { b };
            buf[i] = b;
            new[i] = p[i] - self.lr.at(direction);
        }
        Next {
            p: new,
            momentum: Some(buf),
            m: None,
            v: None,
        }
    }
}

/// How Adam's weight decay enters: folded into the gradient (Adam) or
/// applied to the parameters before the step (AdamW).
enum Decay {
    L2(f64),
    Decoupled(f64),
}

struct Adam<T> {
    l2: L2<T>,
    shrink: Option<Affine<T>>,
    m_ema: Ema<T>,
    v_ema: Ema<T>,
    unbias: Affine<T>,
    plus_eps: Affine<T>,
    step: Affine<T>,
}

impl<T: Real> Adam<T> {
    fn new(eps: f64, lr: f64, bias: BiasCorrections, decay: Decay) -> Self {
        let BiasCorrections {
            betas: [beta1, beta2],
            of: [bc1, bc2],
        } = bias;
        let (l2, shrink) = match decay {
            Decay::L2(wd) => (L2::new(wd), None),
            Decay::Decoupled(wd) => (L2::new(0.0), Some(Affine::scale(1.0 - lr * wd))),
        };
        Adam {
            l2,
            shrink,
            m_ema: Ema::new(beta1),
            v_ema: Ema::new(beta2),
            unbias: Affine::scale(1.0 / bc2.sqrt()),
            plus_eps: Affine::new(1.0, eps),
            step: Affine::scale(lr / bc1),
        }
    }

    #[inline(always)]
    fn run(&self, x: &Inputs<T>, first: bool) -> Next<T> {
        match (first, self.shrink) {
            (true, None) => self.pass::<true, false>(x),
            (true, Some(_)) => self.pass::<true, true>(x),
            (false, None) => self.pass::<false, false>(x),
            (false, Some(_)) => self.pass::<false, true>(x),
        }
    }

    #[inline(always)]
    fn pass<const FIRST: bool, const SHRINK: bool>(&self, x: &Inputs<T>) -> Next<T> {
        let n = x.p.len();
        let (p, g) = (x.p, &x.g[..n]);
        let (m_old, v_old) = (state::<T, FIRST>(x.m, p), state::<T, FIRST>(x.v, p));
        let shrink = self.shrink.unwrap_or(Affine(T::one(), T::zero()));
        let (mut new, mut m, mut v) = (vec![T::zero(); n], vec![T::zero(); n], vec![T::zero(); n]);
        for i in 0..n {
            let base = if SHRINK { shrink.at(p[i]) } else { p[i] };
            let g = self.l2.at(p[i], g[i]);
            let mi = self.m_ema.at::<FIRST>(m_old[i], g);
            let vi = self.v_ema.at::<FIRST>(v_old[i], g * g);
            let denom = self.plus_eps.at(self.unbias.at(vi.sqrt()));
            new[i] = base - self.step.at(mi / denom);
            (m[i], v[i]) = (mi, vi);
        }
        Next {
            p: new,
            momentum: None,
            m: Some(m),
            v: Some(v),
        }
    }
}

struct Rmsprop<T> {
    l2: L2<T>,
    ema: Ema<T>,
    plus_eps: Affine<T>,
    mu: Option<Affine<T>>,
    lr: Affine<T>,
}

impl<T: Real> Rmsprop<T> {
    #[inline(always)]
    fn run<const FIRST: bool>(&self, x: &Inputs<T>) -> Next<T> {
        let n = x.p.len();
        let (p, g) = (x.p, &x.g[..n]);
        let (v_old, mom) = (state::<T, FIRST>(x.v, p), state::<T, FIRST>(x.mom, p));
        let (mut new, mut v) = (vec![T::zero(); n], vec![T::zero(); n]);
        let mut buf = vec![T::zero(); if self.mu.is_some() { n } else { 0 }];
        for i in 0..n {
            let g = self.l2.at(p[i], g[i]);
            let vi = self.ema.at::<FIRST>(v_old[i], g * g);
            let step = g / self.plus_eps.at(vi.sqrt());
            let direction = match self.mu {
                Some(mu) => {
                    let b = momentum_buffer::<T, FIRST>(mu, mom[i], step);
                    buf[i] = b;
                    b
                }
                None => step,
            };
            new[i] = p[i] - self.lr.at(direction);
            v[i] = vi;
        }
        Next {
            p: new,
            momentum: self.mu.is_some().then_some(buf),
            m: None,
            v: Some(v),
        }
    }
}

#[cfg(test)]
mod tests;
