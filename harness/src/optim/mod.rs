//! Optimizers (PyTorch's update rules), learning-rate schedules and clipping.
//!
//! The state is exposed (`state()`) for the probe and for crash dumps.

mod clip;
mod fused;
mod schedule;

pub use clip::{clip, global_norm};
pub use schedule::lr_at;

use crate::probe::TensorScan;
use crate::spec::OptimizerSpec;
use candle_core::{Result, Tensor, Var};

/// Per-parameter optimizer state.
#[derive(Clone, Default)]
struct Slot {
    /// SGD/RMSprop momentum buffer.
    momentum: Option<Tensor>,
    /// Adam first moment.
    m: Option<Tensor>,
    /// Adam second moment / RMSprop square average.
    v: Option<Tensor>,
}

impl Slot {
    /// How many state tensors it holds.
    fn tensors(&self) -> usize {
        [&self.momentum, &self.m, &self.v]
            .iter()
            .filter(|t| t.is_some())
            .count()
    }

    fn detach(&mut self) {
        for t in [&mut self.momentum, &mut self.m, &mut self.v]
            .into_iter()
            .flatten()
        {
            *t = t.detach();
        }
    }
}

/// A case's optimizer: its spec and per-parameter state.
#[derive(Clone)]
pub struct Optimizer {
    spec: OptimizerSpec,
    slots: Vec<Slot>,
    /// Completed update steps (Adam's bias correction uses it).
    steps: usize,
}

/// The kinds of per-parameter optimizer state, as named in dumps.
pub const STATE_KINDS: [&str; 3] = ["momentum", "m", "v"];

impl Optimizer {
    /// An optimizer of `spec` over `params` tensors, with empty state.
    pub fn new(spec: &OptimizerSpec, params: usize) -> Self {
        Optimizer {
            spec: spec.clone(),
            slots: vec![Slot::default(); params],
            steps: 0,
        }
    }

    /// Completed update steps.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// State tensors in parameter order as (parameter index, kind, tensor),
    /// kind being one of [`STATE_KINDS`]. No allocation: the probe walks it
    /// every step.
    pub fn state_tensors(&self) -> impl Iterator<Item = (usize, &'static str, &Tensor)> {
        self.slots.iter().enumerate().flat_map(|(i, slot)| {
            STATE_KINDS
                .into_iter()
                .zip([&slot.momentum, &slot.m, &slot.v])
                .filter_map(move |(kind, t)| t.as_ref().map(|t| (i, kind, t)))
        })
    }

    /// Restores state saved by [`Optimizer::state`] (a crash dump): the
    /// completed step count and each named tensor.
    pub fn restore(
        &mut self,
        steps: usize,
        names: &[String],
        mut state: impl FnMut(&str) -> Option<Tensor>,
    ) {
        self.steps = steps;
        for (slot, name) in self.slots.iter_mut().zip(names) {
            let [momentum, m, v] = STATE_KINDS.map(|kind| state(&format!("{kind}.{name}")));
            (slot.momentum, slot.m, slot.v) = (momentum, m, v);
        }
    }

    /// The same state with every tensor in `dtype` (a re-run of a step at
    /// another precision).
    pub fn to_dtype(&self, dtype: candle_core::DType) -> Result<Optimizer> {
        let convert = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_dtype(dtype)).transpose();
        let slots = self
            .slots
            .iter()
            .map(|s| {
                Ok(Slot {
                    momentum: convert(&s.momentum)?,
                    m: convert(&s.m)?,
                    v: convert(&s.v)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Optimizer {
            spec: self.spec.clone(),
            slots,
            steps: self.steps,
        })
    }

    /// Named state tensors (`m.<param>`, `v.<param>`, `momentum.<param>`).
    pub fn state(&self, names: &[String]) -> Vec<(String, Tensor)> {
        self.state_tensors()
            .map(|(i, kind, t)| (format!("{kind}.{}", names[i]), t.clone()))
            .collect()
    }

    /// Applies one update with learning rate `lr` to each (param, grad) pair.
    pub fn step(&mut self, params: &[Var], grads: &[Tensor], lr: f64) -> Result<()> {
        let (new, _) = self.advance(params, grads, lr, Scan::Nothing)?;
        set(params, new)
    }

    /// [`Optimizer::step`], and what its pass saw of the values it wrote
    /// where every parameter took the fused pass (`None` otherwise: scan
    /// them then).
    pub fn step_checked(
        &mut self,
        params: &[Var],
        grads: &[Tensor],
        lr: f64,
    ) -> Result<Option<UpdateScans>> {
        let (new, scans) = self.advance(params, grads, lr, Scan::Written)?;
        set(params, new)?;
        Ok(scans)
    }

    /// The parameters one update would give, without setting them (the
    /// optimizer's own state does advance): a caller can check them first.
    pub fn update(&mut self, params: &[Var], grads: &[Tensor], lr: f64) -> Result<Vec<Tensor>> {
        Ok(self.advance(params, grads, lr, Scan::Nothing)?.0)
    }

    /// [`Optimizer::update`] with what its pass saw, as [`Optimizer::step_checked`].
    pub fn update_checked(
        &mut self,
        params: &[Var],
        grads: &[Tensor],
        lr: f64,
    ) -> Result<(Vec<Tensor>, Option<UpdateScans>)> {
        self.advance(params, grads, lr, Scan::ReadAndWritten)
    }

    /// [`Optimizer::update_checked`] from `from`'s state, which is left as
    /// it was: this optimizer takes the state after the update. A staged
    /// update (checked before it is accepted) reuses its previous staging
    /// optimizer here, whose old state is then dropped slot by slot as
    /// each new slot is made, as an update in place drops it (dropped all
    /// at once, dozens of frees of one size overflow the allocator's
    /// per-size caches and cost more in every allocation after them).
    /// `reuse`, an earlier update's scans, lends its lists (a step then
    /// allocates none for them).
    pub fn update_checked_from(
        &mut self,
        from: &Optimizer,
        (params, grads): (&[Var], &[Tensor]),
        lr: f64,
        reuse: Option<UpdateScans>,
    ) -> Result<(Vec<Tensor>, Option<UpdateScans>)> {
        self.spec.clone_from(&from.spec);
        self.steps = from.steps;
        self.slots.resize_with(from.slots.len(), Slot::default);
        self.advance_from(Some(from), params, grads, lr, (Scan::ReadAndWritten, reuse))
    }

    /// One update's new parameters and what its fused pass scanned.
    fn advance(
        &mut self,
        params: &[Var],
        grads: &[Tensor],
        lr: f64,
        check: Scan,
    ) -> Result<(Vec<Tensor>, Option<UpdateScans>)> {
        self.advance_from(None, params, grads, lr, (check, None))
    }

    /// [`Optimizer::advance`] reading the state of `from` where given
    /// (same length as this one's), else this optimizer's own; its scans
    /// in `reuse`'s lists where given.
    fn advance_from(
        &mut self,
        from: Option<&Optimizer>,
        params: &[Var],
        grads: &[Tensor],
        lr: f64,
        (check, reuse): (Scan, Option<UpdateScans>),
    ) -> Result<(Vec<Tensor>, Option<UpdateScans>)> {
        self.steps += 1;
        let t = self.steps as i32;
        let bias = fused::BiasCorrections::at(&self.spec, t);
        let mut out = Vec::with_capacity(params.len());
        let mut scans = (check != Scan::Nothing).then(|| UpdateScans::reusing(reuse, params.len()));
        // State tensors of the parameters before this one: where a bad
        // state tensor stands in `state_tensors`.
        let mut states_before = 0;
        let at = params.iter().zip(grads).zip(&mut self.slots).enumerate();
        for (i, ((p, g), slot)) in at {
            // Read from `from`'s slot, written over this one's.
            let source = from.map(|f| &f.slots[i]);
            // A traced re-run takes the op chain (the same bits), whose
            // ops it records with their lines.
            let fused = match crate::instrument::recording() {
                true => None,
                false => fused::update(
                    &self.spec,
                    (p.as_tensor(), g),
                    (source, slot),
                    (lr, bias),
                    check,
                )?,
            };
            let new = match fused {
                Some(fused::Fused { new, checked }) => {
                    if let (Some(all), Some(seen)) = (scans.as_mut(), checked) {
                        all.grads.extend(seen.grad);
                        all.params.push(seen.param);
                        let bad = seen.bad_state.map(|k| states_before + k);
                        all.bad_state = all.bad_state.or(bad);
                        states_before += slot.tensors();
                    }
                    new
                }
                None => {
                    // The op chain: what it wrote is scanned by the caller.
                    scans = None;
                    if let Some(source) = source {
                        slot.clone_from(source);
                    }
                    let new = chain(&self.spec, p, g, slot, lr, t)?;
                    // Off the graph: with weight decay the ops run on the
                    // tracked parameter, and a state that kept its graph
                    // would hold every earlier step's tensors (and overflow
                    // the stack when dropped).
                    slot.detach();
                    new.detach()
                }
            };
            out.push(new);
        }
        Ok((out, scans))
    }
}

/// What an update's fused pass saw of the values it read and wrote: the
/// probe's scan of each gradient and of each new parameter (the same bits
/// as scanning the tensors, except that a tensor whose values are all
/// finite has `max_abs` NaN, not measured: no check reads it outside half
/// precision, which the fused pass does not take) and the first state
/// tensor that is not finite, by its position in
/// [`Optimizer::state_tensors`].
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateScans {
    /// The gradients as the pass read them (a guard checks them from here
    /// instead of a pass of its own).
    pub grads: Vec<TensorScan>,
    /// The updated parameters as the pass wrote them.
    pub params: Vec<TensorScan>,
    /// The first optimizer state tensor that is not finite, if any.
    pub bad_state: Option<usize>,
}

impl UpdateScans {
    /// Empty lists for `n` parameters, `reuse`'s where given.
    fn reusing(reuse: Option<UpdateScans>, n: usize) -> UpdateScans {
        let mut s = reuse.unwrap_or_else(|| UpdateScans {
            grads: Vec::with_capacity(n),
            params: Vec::with_capacity(n),
            bad_state: None,
        });
        s.grads.clear();
        s.params.clear();
        s.bad_state = None;
        s
    }
}

/// What an update's fused pass scans.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    Nothing,
    /// The new parameters and the state it leaves (the runner's check,
    /// after its own gradient check).
    Written,
    /// Those and the gradients it reads (the guard's, whose gradient
    /// check then needs no pass of its own).
    ReadAndWritten,
}

/// The parameters set to their new values.
pub(crate) fn set(params: &[Var], new: Vec<Tensor>) -> Result<()> {
    for (p, new) in params.iter().zip(new) {
        p.set(&new)?;
    }
    Ok(())
}

/// One parameter's update as candle ops (every device and dtype).
#[crate::instrument]
fn chain(
    spec: &OptimizerSpec,
    p: &Var,
    g: &Tensor,
    slot: &mut Slot,
    lr: f64,
    t: i32,
) -> Result<Tensor> {
    Ok(match *spec {
        OptimizerSpec::Sgd {
            momentum,
            nesterov,
            weight_decay,
            ..
        } => {
            let g = with_weight_decay(g, p, weight_decay)?;
            let direction = if momentum > 0.0 {
                let buf = match &slot.momentum {
                    // PyTorch: the first step's buffer is the gradient itself.
                    None => g.clone(),
                    Some(b) => ((b * momentum)? + &g)?,
                };
                slot.momentum = Some(buf.clone());
                if nesterov {
                    (&g + (buf * momentum)?)?
                } else {
                    buf
                }
            } else {
                g
            };
            (p.as_tensor() - (direction * lr)?)?
        }
        OptimizerSpec::Adam {
            beta1,
            beta2,
            eps,
            weight_decay,
            ..
        } => {
            let g = with_weight_decay(g, p, weight_decay)?;
            adam_update(p.as_tensor(), &g, slot, [beta1, beta2, eps], lr, t)?
        }
        OptimizerSpec::Adamw {
            beta1,
            beta2,
            eps,
            weight_decay,
            ..
        } => {
            let decayed = (p.as_tensor() * (1.0 - lr * weight_decay))?;
            adam_update(&decayed, g, slot, [beta1, beta2, eps], lr, t)?
        }
        OptimizerSpec::Rmsprop {
            alpha,
            eps,
            momentum,
            weight_decay,
            ..
        } => {
            let g = with_weight_decay(g, p, weight_decay)?;
            let v = ema(slot.v.as_ref(), &g.sqr()?, alpha)?;
            let avg = (v.sqrt()? + eps)?;
            slot.v = Some(v);
            let direction = if momentum > 0.0 {
                let step = (&g / &avg)?;
                let buf = match &slot.momentum {
                    None => step,
                    Some(b) => ((b * momentum)? + step)?,
                };
                slot.momentum = Some(buf.clone());
                buf
            } else {
                (&g / &avg)?
            };
            (p.as_tensor() - (direction * lr)?)?
        }
    })
}

/// g + wd · p (L2 regularization folded into the gradient).
#[crate::instrument]
fn with_weight_decay(g: &Tensor, p: &Var, wd: f64) -> Result<Tensor> {
    if wd == 0.0 {
        Ok(g.clone())
    } else {
        g + (p.as_tensor() * wd)?
    }
}

/// decay · state + (1 - decay) · x, starting from zero state.
#[crate::instrument]
fn ema(state: Option<&Tensor>, x: &Tensor, decay: f64) -> Result<Tensor> {
    match state {
        None => x * (1.0 - decay),
        Some(s) => (s * decay)? + (x * (1.0 - decay))?,
    }
}

/// PyTorch's Adam step: p - (lr / bc1) · m / (sqrt(v) / sqrt(bc2) + eps).
#[crate::instrument]
fn adam_update(
    p: &Tensor,
    g: &Tensor,
    slot: &mut Slot,
    [beta1, beta2, eps]: [f64; 3],
    lr: f64,
    t: i32,
) -> Result<Tensor> {
    let m = ema(slot.m.as_ref(), g, beta1)?;
    let v = ema(slot.v.as_ref(), &g.sqr()?, beta2)?;
    let bc1 = 1.0 - beta1.powi(t);
    let bc2 = 1.0 - beta2.powi(t);
    let denom = ((v.sqrt()? / bc2.sqrt())? + eps)?;
    let new = (p - ((&m / denom)? * (lr / bc1))?)?;
    slot.m = Some(m);
    slot.v = Some(v);
    Ok(new)
}

#[cfg(test)]
mod tests;
