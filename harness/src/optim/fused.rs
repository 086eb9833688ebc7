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

mod lanes;
mod rules;

use super::{Scan, Slot};
use crate::kernels::Real;
use crate::probe::{all_finite_pair_real, all_finite_real, norm_scan_real, TensorScan};
use crate::spec::OptimizerSpec;
use candle_core::{Result, Storage, StorageRef, Tensor};
pub(super) use rules::BiasCorrections;
use rules::{Adam, Decoupled, Rmsprop, Rule, Sgd, SgdMomentum, WithMomentum};
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
fn apply<T: Vectors>(
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
#[inline(always)]
fn run<T: Vectors>(
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
    Ok(rule(spec, &x, (lr, bias), check))
}

/// The first of the state tensors an update leaves (counted in
/// [`super::STATE_KINDS`] order) that is not finite; where it leaves two
/// (Adam's m and v, RMSprop's v and momentum), both in one loop first.
#[inline(always)]
fn first_bad_state<T: Real>(next: &Next<T>) -> Option<usize> {
    let mut left = next.states();
    if let (Some(a), Some(b), None) = (left.next(), left.next(), left.next()) {
        if all_finite_pair_real(a, b) {
            return None;
        }
    }
    next.first_bad()
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

/// The pass: the rule for the spec over every value, and what `check`
/// asks to be seen of what it read and wrote; `None` where its state is a
/// mix. On AVX2 with FMA the loops run on 256-bit vectors (the same
/// IEEE operations, the same bits).
fn rule<T: Vectors>(
    spec: &OptimizerSpec,
    x: &Inputs<T>,
    (lr, bias): (f64, BiasCorrections),
    check: Scan,
) -> Option<(Next<T>, Option<Checked>)> {
    crate::kernels::wide(
        #[inline(always)]
        || rule_of(spec, x, (lr, bias), check),
    )
}

/// Each rule, its loop inlined (so compiled for the caller's vectors) and
/// monomorphized for the first step or a later one (no branch per value).
#[inline(always)]
fn rule_of<T: Vectors>(
    spec: &OptimizerSpec,
    x: &Inputs<T>,
    (lr, bias): (f64, BiasCorrections),
    check: Scan,
) -> Option<(Next<T>, Option<Checked>)> {
    Some(match *spec {
        OptimizerSpec::Sgd {
            momentum,
            nesterov,
            weight_decay,
            ..
        } => {
            let sgd = Sgd::new(lr, weight_decay);
            // As the op chain tests it (a NaN momentum is no momentum).
            if momentum > 0.0 {
                let sgd = SgdMomentum::new(sgd, momentum, nesterov);
                pass(&sgd, x, first_step(&[x.mom])?, check)
            } else {
                pass(&sgd, x, false, check)
            }
        }
        OptimizerSpec::Adam {
            eps, weight_decay, ..
        } => {
            let first = first_step(&[x.m, x.v])?;
            pass(&Adam::new(eps, lr, bias, weight_decay), x, first, check)
        }
        OptimizerSpec::Adamw {
            eps, weight_decay, ..
        } => {
            let first = first_step(&[x.m, x.v])?;
            pass(
                &Decoupled::new(eps, lr, bias, weight_decay),
                x,
                first,
                check,
            )
        }
        OptimizerSpec::Rmsprop {
            alpha,
            eps,
            momentum,
            weight_decay,
            ..
        } => {
            let rms = Rmsprop::new(lr, alpha, eps, momentum, weight_decay);
            if momentum > 0.0 {
                let first = first_step(&[x.v, x.mom])?;
                pass(&WithMomentum(rms), x, first, check)
            } else {
                pass(&rms, x, first_step(&[x.v])?, check)
            }
        }
    })
}

/// A kernel float's passes: the plain loop, or vectors where it has them.
trait Vectors: Real {
    /// The pass on vectors, where this type has them on this CPU.
    fn vector_pass<R: Rule<Self>>(
        _rule: &R,
        _x: &Inputs<Self>,
        _first: bool,
        _check: Scan,
    ) -> Option<(Next<Self>, Option<Checked>)> {
        None
    }
}

impl Vectors for f64 {}

impl Vectors for f32 {
    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn vector_pass<R: Rule<f32>>(
        rule: &R,
        x: &Inputs<f32>,
        first: bool,
        check: Scan,
    ) -> Option<(Next<f32>, Option<Checked>)> {
        #[cfg(target_arch = "x86_64")]
        // AVX2 on an AVX-512 CPU too: a 512-bit pass was measured slower
        // (docs/PERFORMANCE-LOG.md, 2026-12-06).
        if crate::kernels::vectors().isa() != crate::kernels::VectorIsa::Baseline
            && std::is_x86_feature_detected!("fma")
        {
            use Scan::{Nothing, ReadAndWritten, Written};
            // SAFETY: the CPU has the features the vector pass is compiled for.
            return Some(unsafe {
                match (first, check) {
                    (true, Nothing) => vector_pass::<R, true, false, false>(rule, x),
                    (true, Written) => vector_pass::<R, true, false, true>(rule, x),
                    (true, ReadAndWritten) => vector_pass::<R, true, true, true>(rule, x),
                    (false, Nothing) => vector_pass::<R, false, false, false>(rule, x),
                    (false, Written) => vector_pass::<R, false, false, true>(rule, x),
                    (false, ReadAndWritten) => vector_pass::<R, false, true, true>(rule, x),
                }
            });
        }
        None
    }
}

/// The rule over every value, on vectors where `T` has them; then the
/// scans `check` asks for, in a loop of their own.
#[inline(always)]
fn pass<T: Vectors, R: Rule<T>>(
    rule: &R,
    x: &Inputs<T>,
    first: bool,
    check: Scan,
) -> (Next<T>, Option<Checked>) {
    if let Some(done) = T::vector_pass(rule, x, first, check) {
        return done;
    }
    let next = match first {
        true => plain_pass::<T, R, true>(rule, x),
        false => plain_pass::<T, R, false>(rule, x),
    };
    let checked = (check != Scan::Nothing).then(|| Checked {
        grad: (check == Scan::ReadAndWritten).then(|| norm_scan_real(&x.g[..x.p.len()])),
        param: norm_scan_real(&next.p),
        bad_state: first_bad_state(&next),
    });
    (next, checked)
}

/// The rule over every value, one at a time (LLVM vectorizes the loop).
#[inline(always)]
fn plain_pass<T: Real, R: Rule<T>, const FIRST: bool>(rule: &R, x: &Inputs<T>) -> Next<T> {
    let n = x.p.len();
    let (p, g) = (x.p, &x.g[..n]);
    let mut new = vec![T::zero(); n];
    let ([s0, s1, s2], [mut w0, mut w1, mut w2]) = buffers::<T, R, FIRST>(x);
    for i in 0..n {
        let (value, state) = rule.at::<T, FIRST>(p[i], g[i], [s0[i], s1[i], s2[i]]);
        new[i] = value;
        for (k, out) in [&mut w0, &mut w1, &mut w2].into_iter().enumerate() {
            if R::WRITES[k] {
                out[i] = state[k];
            }
        }
    }
    Next::of(new, [w0, w1, w2], R::WRITES)
}

/// The rule on eight f32 at a time, the tail one at a time; the scans
/// asked for (`GRAD`: the gradient's, `WRITTEN`: the new values' and the
/// states' finiteness) added up in the same loop, in the probe's lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn vector_pass<R: Rule<f32>, const FIRST: bool, const GRAD: bool, const WRITTEN: bool>(
    rule: &R,
    x: &Inputs<f32>,
) -> (Next<f32>, Option<Checked>) {
    use crate::probe::{carried_finite_f32, carry_f32, norm_scan_of_lanes, LANES};
    use lanes::{F32x8, Finite, SquareSums};
    let n = x.p.len();
    let (p, g) = (x.p, &x.g[..n]);
    let mut new = vec![0f32; n];
    let ([s0, s1, s2], mut out) = buffers::<f32, R, FIRST>(x);
    let (mut grad_sums, mut new_sums, mut finite) =
        (SquareSums::new(), SquareSums::new(), Finite::new());
    let whole = n - n % LANES;
    // SAFETY (the loads and stores): `i + 8 <= whole <= n`, the length of
    // every slice read and of every state written.
    for i in (0..whole).step_by(LANES) {
        let gi = F32x8::load(g, i);
        let state = [F32x8::load(s0, i), F32x8::load(s1, i), F32x8::load(s2, i)];
        let (value, state) = rule.at::<F32x8, FIRST>(F32x8::load(p, i), gi, state);
        value.store(&mut new, i);
        for (k, out) in out.iter_mut().enumerate() {
            if R::WRITES[k] {
                state[k].store(out, i);
                if WRITTEN {
                    finite.add(state[k]);
                }
            }
        }
        if GRAD {
            grad_sums.add(gi);
        }
        if WRITTEN {
            new_sums.add(value);
        }
    }
    let (mut grad_lanes, mut new_lanes) = (grad_sums.lanes(), new_sums.lanes());
    let mut carry = 0u32;
    for i in whole..n {
        let (value, state) = rule.at::<f32, FIRST>(p[i], g[i], [s0[i], s1[i], s2[i]]);
        new[i] = value;
        for (k, out) in out.iter_mut().enumerate() {
            if R::WRITES[k] {
                out[i] = state[k];
                if WRITTEN {
                    carry |= carry_f32(state[k]);
                }
            }
        }
        let square = |v: f32| v as f64 * v as f64;
        if GRAD {
            grad_lanes[i - whole] += square(g[i]);
        }
        if WRITTEN {
            new_lanes[i - whole] += square(value);
        }
    }
    let next = Next::of(new, out, R::WRITES);
    let checked = WRITTEN.then(|| Checked {
        grad: GRAD.then(|| norm_scan_of_lanes(&grad_lanes, g)),
        param: norm_scan_of_lanes(&new_lanes, &next.p),
        bad_state: match finite.all() && carried_finite_f32(carry) {
            true => None,
            false => next.first_bad(),
        },
    });
    (next, checked)
}

/// The states a pass reads (the parameters stand in where there are
/// none yet, unread) and the buffers of those it writes (empty for the
/// others), each cut to the parameter's length.
#[inline(always)]
#[allow(clippy::type_complexity)]
fn buffers<'a, T: Real, R: Rule<T>, const FIRST: bool>(
    x: &Inputs<'a, T>,
) -> ([&'a [T]; 3], [Vec<T>; 3]) {
    let n = x.p.len();
    let read = |s| state::<T, FIRST>(s, x.p);
    let written = |w: bool| vec![T::zero(); if w { n } else { 0 }];
    let [a, b, c] = R::WRITES;
    (
        [read(x.mom), read(x.m), read(x.v)],
        [written(a), written(b), written(c)],
    )
}

impl<T> Next<T> {
    /// The new values and the states a rule writes (the others empty).
    fn of(p: Vec<T>, states: [Vec<T>; 3], writes: [bool; 3]) -> Self {
        let [momentum, m, v] = states;
        let [wm, wa, wv] = writes;
        Next {
            p,
            momentum: wm.then_some(momentum),
            m: wa.then_some(m),
            v: wv.then_some(v),
        }
    }

    /// The states it writes, in [`super::STATE_KINDS`] order.
    fn states(&self) -> impl Iterator<Item = &Vec<T>> {
        [&self.momentum, &self.m, &self.v].into_iter().flatten()
    }
}

impl<T: Real> Next<T> {
    /// The first state it writes that is not finite, one state at a time.
    fn first_bad(&self) -> Option<usize> {
        self.states().position(|s| !all_finite_real(s))
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

#[cfg(test)]
mod tests;
