//! One training step as a chain of phases: batch → forward and loss →
//! backward → (one device→host copy, on accelerators) → gradient scan →
//! clip → update → watch. Each phase either hands its result on or ends the
//! step ([`Flow`]); how values come back from the device is chosen once per
//! session ([`Readback`]), not decided line by line.

use super::{Failure, Forward, Session};
use crate::checks;
use crate::data::HostBatch;
use crate::error::Result;
use crate::finding::{FindingKind, OpKind, Phase, StageOp};
use crate::localize;
use crate::models::Tracer;
use crate::optim;
use crate::probe::{scan_all, TensorScan};
use crate::scaler::ScaleVerdict;
use crate::spec::ClipSpec;
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor};

/// How the probe reads values back from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Readback {
    /// Each value where it is made, at no cost (the CPU, and every traced
    /// re-run, which must name the first producer).
    InPlace,
    /// One device→host copy per step, with the gradients: the loss, every
    /// gradient, and the previous step's parameters and optimizer state,
    /// whose update is checked there (accelerators).
    Deferred,
}

/// A failed step: its own failure, or (deferred readback) the previous
/// step's update, seen at this step's copy.
pub(super) enum Failed {
    ThisStep(Box<Failure>),
    PreviousUpdate(Box<Failure>),
}

impl Failed {
    pub fn into_failure(self) -> Box<Failure> {
        match self {
            Failed::ThisStep(f) | Failed::PreviousUpdate(f) => f,
        }
    }
}

/// What a phase hands on: the step goes on with a value, or ends (a
/// failure, or a step that dynamic loss scaling skips).
enum Flow<T> {
    Go(T),
    End(Option<Failed>),
}

fn fail<T>(f: Failure) -> Result<Flow<T>> {
    Ok(Flow::End(Some(Failed::ThisStep(Box::new(f)))))
}

/// The value a phase handed on, or the step's end.
macro_rules! go {
    ($flow:expr) => {
        match $flow? {
            Flow::Go(v) => v,
            Flow::End(end) => return Ok(end),
        }
    };
}

impl Session<'_> {
    /// One step. `fine` (localization) checks the data stage by stage and
    /// analyses the tracer's records when the loss or a gradient fails.
    pub(super) fn step_inner(
        &mut self,
        step: usize,
        lr: f64,
        tracer: &mut Tracer,
        fine: bool,
    ) -> Result<Option<Failed>> {
        // A seeded dropout draws the same masks whenever the step runs.
        crate::models::seeded::at_step(step as u64, || self.phases(step, lr, tracer, fine))
    }

    fn phases(
        &mut self,
        step: usize,
        lr: f64,
        tracer: &mut Tracer,
        fine: bool,
    ) -> Result<Option<Failed>> {
        self.trace.lrs.push(lr);
        let readback = if fine {
            Readback::InPlace
        } else {
            self.readback
        };
        let batch = go!(self.batch_phase(step, fine));
        let (forward, loss_value) = go!(self.forward_phase(&batch, tracer, readback, fine));
        // The scale the loss was multiplied by; the scaler may change it below.
        let scale = self.scaler.scale;
        let (mut grads, grad_store) = go!(self.backward_phase(&forward.loss, scale, tracer));
        tracer.begin_update();
        if self.check_gradients && step == 0 {
            go!(self.gradient_phase(&batch, &grads, scale));
        }
        let (loss_value, scans) = match readback {
            Readback::InPlace => (loss_value, None),
            Readback::Deferred => {
                let (value, scans) = go!(self.copy_phase(&forward, &grads, tracer));
                (value, Some(scans))
            }
        };
        if self.grads_checked_in_update(scale, fine, readback) {
            go!(self.checked_update_phase(step, (&grads, lr), tracer, &grad_store));
            return self.watch_phase(loss_value, readback);
        }
        let scanned = (step, scans, scale);
        let norm = go!(self.scan_phase(&forward.loss, &grads, scanned, tracer, &grad_store));
        go!(self.clip_phase(&mut grads, norm, scale, fine));
        go!(self.update_phase(&grads, lr, readback));
        self.watch_phase(loss_value, readback)
    }

    /// Whether the gradient check can ride on the optimizer's pass, which
    /// reads every gradient anyway: the probe on and read in place, no
    /// loss scale, no clipping (whose norm comes first), not a traced
    /// re-run (which checks stage by stage).
    pub(super) fn grads_checked_in_update(
        &self,
        scale: f64,
        fine: bool,
        readback: Readback,
    ) -> bool {
        self.probe
            && !fine
            && readback == Readback::InPlace
            && self.update_dtype().is_none()
            && scale == 1.0
            && self.case.precision.loss_scaling().is_none()
            && matches!(self.case.clip, ClipSpec::None)
    }

    /// The update with the gradient check inside its fused pass: the
    /// gradients' scans as the pass read them (a scan of its own where the
    /// pass did not run), checked before anything is set, as the gradient
    /// phase checks them; then the update's check as the update phase's.
    fn checked_update_phase(
        &mut self,
        step: usize,
        (grads, lr): (&[Tensor], f64),
        tracer: &Tracer,
        grad_store: &GradStore,
    ) -> Result<Flow<()>> {
        // Staged: a gradient that fails leaves the optimizer's state as
        // the gradient phase did.
        let (new, seen) =
            self.staging
                .update_checked_from(&self.optimizer, (&self.vars, grads), lr, None)?;
        let read = seen.as_ref().filter(|s| s.grads.len() == grads.len());
        let own;
        let scans = match read {
            Some(s) => &s.grads,
            None => {
                own = scan_all(&grads.iter().collect::<Vec<_>>())?;
                &own
            }
        };
        if let Some(i) = checks::first_bad(scans) {
            let namer = self.namer();
            return fail(namer.backward_failure(i, &scans[i], &grads[i], tracer, grad_store)?);
        }
        let norm = self.grad_norm(step, scans);
        self.trace.grad_norms.push(norm);
        std::mem::swap(&mut self.optimizer, &mut self.staging);
        optim::set(&self.vars, new)?;
        match self.check_update(seen)? {
            Some(f) => fail(f),
            None => Ok(Flow::Go(())),
        }
    }

    /// The batch, checked after the data and every augmentation.
    fn batch_phase(&self, step: usize, fine: bool) -> Result<Flow<HostBatch>> {
        Ok(match self.batch_checked(step, fine)? {
            Ok(b) => Flow::Go(b),
            Err(f) => Flow::End(Some(Failed::ThisStep(f))),
        })
    }

    /// The forward pass and the loss; read in place, the loss is checked
    /// here (deferred, it comes back with the gradients: NaN until then).
    fn forward_phase(
        &mut self,
        batch: &HostBatch,
        tracer: &mut Tracer,
        readback: Readback,
        fine: bool,
    ) -> Result<Flow<(Forward, f64)>> {
        let forward = self.forward_loss(batch, tracer)?;
        if readback == Readback::Deferred {
            return Ok(Flow::Go((forward, f64::NAN)));
        }
        let loss_value = forward.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        self.trace.losses.push(loss_value);
        // In execution order the forward stages come first: a non-finite
        // stage output is the producer even when a later op masked it
        // (relu(NaN) is 0 in candle) and the failure surfaced downstream.
        if (fine && localize::first_forward(&tracer.records())?.is_some())
            || !loss_value.is_finite()
        {
            let namer = self.namer();
            return fail(namer.forward_failure(&forward, loss_value, tracer)?);
        }
        Ok(Flow::Go((forward, loss_value)))
    }

    /// The gradients of the (scaled) loss, one per trainable variable; a
    /// variable without one ends the step with a `no_gradient` failure.
    fn backward_phase(
        &self,
        loss: &Tensor,
        scale: f64,
        tracer: &Tracer,
    ) -> Result<Flow<(Vec<Tensor>, GradStore)>> {
        let scaled = if scale != 1.0 {
            (loss * scale)?
        } else {
            loss.clone()
        };
        let grad_store = match scaled.backward() {
            Ok(g) => g,
            // An op without a backward pass is the model's finding, not an error.
            Err(e) => match crate::backward::unsupported(&e) {
                Some(u) => return fail(checks::unsupported_backward_in(u, &tracer.records())),
                None => return Err(e.into()),
            },
        };
        let grads: Option<Vec<Tensor>> = self
            .vars
            .iter()
            .map(|v| grad_store.get(v.as_tensor()).cloned())
            .collect();
        match grads {
            Some(grads) => Ok(Flow::Go((grads, grad_store))),
            None => {
                let records = tracer.records();
                let coverage = crate::coverage::of(&self.names, &self.vars, &grad_store, &records);
                fail(checks::coverage(coverage).expect("a variable without a gradient"))
            }
        }
    }

    /// The opt-in check of the first step: each gradient's derivative along
    /// a seeded unit direction against the loss's central differences at
    /// two steps ([`checks::gradient::directional`]); the parameters are
    /// restored bit for bit. Half precision is not checked (its finite
    /// differences are noise).
    fn gradient_phase(&self, batch: &HostBatch, grads: &[Tensor], scale: f64) -> Result<Flow<()>> {
        use checks::gradient::{directional, Tolerance, LARGER_STEP};
        if self.half {
            return Ok(Flow::Go(()));
        }
        let loss_at = || -> Result<f64> {
            let loss = self.forward_loss(batch, &mut Tracer::off())?.loss;
            Ok(loss.to_dtype(DType::F64)?.to_scalar::<f64>()?)
        };
        let tol = match self.compute {
            DType::F64 => Tolerance::F64,
            _ => Tolerance::f32(loss_at()?),
        };
        for (i, (var, g)) in self.vars.iter().zip(grads).enumerate() {
            let original = var.as_tensor().copy()?;
            let d = self.direction(i, &original)?;
            let analytic = (g.to_dtype(DType::F64)? * &d)?
                .sum_all()?
                .to_scalar::<f64>()?
                / scale;
            let d = d.to_dtype(original.dtype())?;
            let numeric_at = |h: f64| -> Result<f64> {
                var.set(&(&original + (&d * h)?)?)?;
                let up = loss_at()?;
                var.set(&(&original - (&d * h)?)?)?;
                let down = loss_at()?;
                Ok((up - down) / (2.0 * h))
            };
            let numeric = numeric_at(tol.step);
            let larger = numeric.and_then(|n| Ok((n, numeric_at(LARGER_STEP * tol.step)?)));
            var.set(&original)?;
            let (numeric, larger) = larger?;
            if let Some(f) = directional(&self.names[i], analytic, numeric, larger, tol) {
                return fail(f);
            }
        }
        Ok(Flow::Go(()))
    }

    /// Tensor `i`'s seeded unit direction, in f64 (the harness's RNG).
    fn direction(&self, i: usize, like: &Tensor) -> Result<Tensor> {
        let mut rng = crate::rng::Rng::keyed(self.case.seed, "gradient.direction", i as u64);
        let v: Vec<f64> = (0..like.elem_count()).map(|_| rng.normal()).collect();
        let norm = v
            .iter()
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt()
            .max(f64::MIN_POSITIVE);
        let v: Vec<f64> = v.into_iter().map(|x| x / norm).collect();
        Ok(Tensor::from_vec(v, like.shape(), like.device())?)
    }

    /// Deferred readback's one synchronization of the step: the loss, the
    /// gradients and (for the previous step's update) parameters and
    /// optimizer state, reduced on the device and copied back together.
    /// Hands on the loss and the gradients' scans.
    fn copy_phase(
        &mut self,
        forward: &Forward,
        grads: &[Tensor],
        tracer: &Tracer,
    ) -> Result<Flow<(f64, Vec<TensorScan>)>> {
        let n = grads.len();
        let (value, scans, previous) = {
            let mut tensors: Vec<&Tensor> = grads.iter().collect();
            if self.probe && self.unchecked.is_some() {
                tensors.extend(self.update_tensors());
            }
            let (value, scans) = crate::probe::scan_step(&forward.loss, &tensors)?;
            let previous = match scans[n..].iter().position(|s| !s.is_finite()) {
                Some(i) => Some(
                    self.namer()
                        .update_failure(i, &scans[n + i], tensors[n + i])?,
                ),
                None => None,
            };
            (value, scans, previous)
        };
        self.syncs += 1;
        if let Some(f) = previous {
            // This step did not happen: its LR leaves the history again.
            self.trace.lrs.pop();
            return Ok(Flow::End(Some(Failed::PreviousUpdate(Box::new(f)))));
        }
        if self.probe && self.unchecked.is_some() {
            // The previous update's parameters, finite: their norm.
            let params = &scans[n..n + self.vars.len()];
            self.trace
                .param_norms
                .push(crate::probe::global_norm(params));
        }
        self.trace.losses.push(value);
        if !value.is_finite() {
            let namer = self.namer();
            return fail(namer.forward_failure(forward, value, tracer)?);
        }
        Ok(Flow::Go((value, scans[..n].to_vec())))
    }

    /// The gradients' scan, where the probe, loss scaling or clipping needs
    /// it: a non-finite gradient fails the step (or makes dynamic scaling
    /// skip it); hands on the global gradient norm.
    fn scan_phase(
        &mut self,
        loss: &Tensor,
        grads: &[Tensor],
        (step, scans, scale): (usize, Option<Vec<TensorScan>>, f64),
        tracer: &Tracer,
        grad_store: &GradStore,
    ) -> Result<Flow<Option<f64>>> {
        let scaling = self.case.precision.loss_scaling().is_some();
        let needs_scan = self.probe
            || scale != 1.0
            || matches!(self.case.clip, ClipSpec::Norm { .. })
            || scaling;
        if !needs_scan {
            return Ok(Flow::Go(None));
        }
        let scans = match scans {
            Some(scans) => scans,
            None => scan_all(&grads.iter().collect::<Vec<_>>())?,
        };
        let bad = checks::first_bad(&scans);
        if let (true, Some(_)) = (self.scaler.is_dynamic(), bad) {
            // A NaN that is still there at the smallest scale (from 0·∞ or
            // sqrt'(0), say) is no overflow that scaling absorbs: a NaN at
            // every scale is a NaN, not a scale collapse. (Infinities that
            // stay at the floor are the collapse the scaler reports.)
            if let Some(f) = self.nan_at_any_scale(loss, tracer)? {
                return fail(f);
            }
        }
        let verdict = if scaling {
            self.scaler.update(bad.is_none())
        } else if bad.is_none() {
            ScaleVerdict::Apply
        } else {
            ScaleVerdict::Fail
        };
        match (verdict, bad) {
            (ScaleVerdict::Skip, _) => {
                self.trace.skipped_steps += 1;
                return Ok(Flow::End(None));
            }
            (ScaleVerdict::Fail, Some(i)) => {
                let mut f = self
                    .namer()
                    .backward_failure(i, &scans[i], &grads[i], tracer, grad_store)?;
                if self.scaler.is_dynamic() {
                    f.kind = FindingKind::ScaleCollapse;
                    f.detail = format!(
                        "gradients kept overflowing: the loss scale fell to {} after {} skipped steps; {}",
                        self.scaler.scale, self.scaler.skipped, f.detail
                    );
                }
                return fail(f);
            }
            _ => {}
        }
        Ok(Flow::Go(Some(self.grad_norm(step, &scans) / scale)))
    }

    /// The global norm of the healthy gradients of `step` these scans
    /// describe (in half precision, warned of where one came near its
    /// dtype's largest value).
    fn grad_norm(&mut self, step: usize, scans: &[TensorScan]) -> f64 {
        if self.half {
            let dtypes: Vec<DType> = self.vars.iter().map(|v| v.dtype()).collect();
            let names = (&self.names[..], &dtypes[..]);
            checks::warn_half_margins(step, names, scans, &mut self.trace.warnings);
        }
        self.grad_sq.clear();
        self.grad_sq.extend(scans.iter().map(|s| s.sum_sq));
        optim::global_norm(&self.grad_sq)
    }

    /// The backward pass again at the smallest scale (the floor, or 1 if
    /// lower); its failure when a gradient still holds a NaN there.
    fn nan_at_any_scale(&self, loss: &Tensor, tracer: &Tracer) -> Result<Option<Failure>> {
        let floor = self.scaler.floor().min(1.0);
        let store = (loss * floor)?.backward()?;
        let grads: Vec<Tensor> = self
            .vars
            .iter()
            .filter_map(|v| store.get(v.as_tensor()).cloned())
            .collect();
        let scans = scan_all(&grads.iter().collect::<Vec<_>>())?;
        let Some(i) = scans.iter().position(|s| s.nan > 0) else {
            return Ok(None);
        };
        let mut f = self
            .namer()
            .backward_failure(i, &scans[i], &grads[i], tracer, &store)?;
        f.detail = format!(
            "{}; still NaN at a loss scale of {floor:e}: no scale absorbs it",
            f.detail
        );
        Ok(Some(f))
    }

    /// Unscaled, recorded and clipped gradients; a traced re-run checks
    /// that clipping kept them finite.
    fn clip_phase(
        &mut self,
        grads: &mut [Tensor],
        norm: Option<f64>,
        scale: f64,
        fine: bool,
    ) -> Result<Flow<()>> {
        if scale != 1.0 {
            for g in grads.iter_mut() {
                *g = (&*g * (1.0 / scale))?;
            }
        }
        if let Some(n) = norm {
            self.trace.grad_norms.push(n);
        }
        optim::clip(&self.case.clip, grads, norm.unwrap_or(0.0))?;
        if fine {
            let refs: Vec<&Tensor> = grads.iter().collect();
            if let Some((i, s)) = scan_all(&refs)?
                .into_iter()
                .enumerate()
                .find(|(_, s)| !s.is_finite())
            {
                let f = checks::tensor_failure(
                    &s,
                    self.half,
                    Phase::Update,
                    "clip".into(),
                    &format!(
                        "clipping made the gradient of `{}` non-finite",
                        self.names[i]
                    ),
                    &grads[i],
                )?
                .with_op(Some(StageOp::declared(OpKind::Clip)));
                return fail(f);
            }
        }
        Ok(Flow::Go(()))
    }

    /// The optimizer's update; read in place, parameters and optimizer
    /// state are checked now (deferred: at the next step's copy).
    fn update_phase(&mut self, grads: &[Tensor], lr: f64, readback: Readback) -> Result<Flow<()>> {
        if let Some(dtype) = self.update_dtype() {
            self.update_in(dtype, grads, lr)?;
            return match self.check_update(None)? {
                Some(f) => fail(f),
                None => Ok(Flow::Go(())),
            };
        }
        if !(self.probe && readback == Readback::InPlace) {
            self.optimizer.step(&self.vars, grads, lr)?;
            return Ok(Flow::Go(()));
        }
        // The fused pass scans what it writes: no second pass over it.
        let seen = self.optimizer.step_checked(&self.vars, grads, lr)?;
        match self.check_update(seen)? {
            Some(f) => fail(f),
            None => Ok(Flow::Go(())),
        }
    }

    /// The dtype the update is computed in where it is not the
    /// parameters' (the framework check's emulation of `torch.optim` on
    /// half-precision parameters).
    fn update_dtype(&self) -> Option<DType> {
        self.intervention.as_ref().and_then(|i| i.update_dtype())
    }

    /// One update computed in `dtype` (parameters, gradients and state cast
    /// to it, each op of the update rounded to it), its results set back
    /// in the parameters' dtype.
    fn update_in(&mut self, dtype: DType, grads: &[Tensor], lr: f64) -> Result<()> {
        let cast = |t: &Tensor| t.to_dtype(dtype);
        let params = self
            .vars
            .iter()
            .map(|v| candle_core::Var::from_tensor(&cast(v.as_tensor())?))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let grads = grads
            .iter()
            .map(cast)
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut optimizer = self.optimizer.to_dtype(dtype)?;
        let new = optimizer.update(&params, &grads, lr)?;
        let master = self.params.master_dtype();
        let new = new
            .iter()
            .map(|t| t.to_dtype(master))
            .collect::<candle_core::Result<Vec<_>>>()?;
        self.optimizer = optimizer.to_dtype(master)?;
        Ok(optim::set(&self.vars, new)?)
    }

    /// The loss trend: divergence ends the run.
    fn watch_phase(&mut self, loss_value: f64, readback: Readback) -> Result<Option<Failed>> {
        if !self.watch_divergence {
            return Ok(None);
        }
        let Some(diverged) = checks::trend(&mut self.tracker, loss_value) else {
            return Ok(None);
        };
        // A failed update comes before divergence, as when read in place
        // (an extra synchronization, only when the run is over anyway).
        if self.probe && readback == Readback::Deferred {
            if let Some(f) = self.check_update(None)? {
                return Ok(Some(Failed::ThisStep(Box::new(f))));
            }
        }
        Ok(Some(Failed::ThisStep(Box::new(diverged))))
    }
}
