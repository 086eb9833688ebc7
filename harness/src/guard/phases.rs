//! A guarded step's phases, each one of the shared checks
//! ([`crate::checks`]) over what the user's loop produced: the batch, the
//! loss, which variables got a gradient, the gradients and their norm, the
//! trend, the update. A phase hands on its value or the step's failure.

use super::state::Before;
use super::{Batch, Guard, GuardOptimizer};
use crate::checks::{self, Updated};
use crate::error::{Error, Result};
use crate::finding::{Failure, Grew, Phase};
use crate::probe::{first_non_finite, global_norm, scan_all, TensorScan, TensorStats};
use candle_core::backprop::GradStore;
use candle_core::{DType, Result as CandleResult, Tensor, Var};
use std::borrow::Cow;

/// The value a phase handed on, or the step's failure.
macro_rules! go {
    ($phase:expr) => {
        match $phase? {
            Ok(v) => v,
            Err(failure) => return Ok(Err(failure)),
        }
    };
}

/// A phase's result: its value, or the step's failure.
type Phased<T> = Result<std::result::Result<T, Failure>>;

impl Guard {
    /// The step's phases in order; the step's loss, or its failure.
    pub(super) fn checked_step<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        batch: &Batch,
        opt: &mut O,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
        before: &Before,
    ) -> Phased<f64> {
        go!(self.batch_phase(batch));
        let (loss, value) = go!(self.loss_phase(batch, loss_of));
        let grads = loss.backward()?;
        // Computed, not set (nothing changes before every check passed):
        // its pass reads every gradient, and scans them as it reads them.
        let prepared = opt.prepare(&grads)?;
        // Asked once a step: the phases below line up its scans with the
        // guard's variables where it updates exactly them.
        let exact = opt.updates_exactly(&self.vars);
        if !(opt.prepared_every_gradient() && exact) {
            let coverage = crate::coverage::of(&self.names, &self.vars, &grads, &[]);
            go!(unless(checks::coverage(coverage)));
        }
        go!(self.gradient_phase(step, &grads, (before, &*opt, exact)));
        // The loss trend first: a diverged run takes no update.
        go!(unless(checks::trend(&mut self.tracker, value)));
        self.watch_crossing(step, batch, before, opt)?;
        go!(self.update_phase(step, (&grads, prepared, exact), opt, before));
        self.keep_jump_batch(batch);
        Ok(Ok(value))
    }

    /// The data check on the batch's float tensors.
    fn batch_phase(&self, batch: &Batch) -> Phased<()> {
        for (name, t) in batch.parts() {
            // Checked against its own dtype's range, which no finite value
            // leaves: the bit test decides, the scan only describes.
            if !t.dtype().is_float() || first_non_finite(&[t])?.is_none() {
                continue;
            }
            let Some(bad) = checks::batch_values(&scan_all(&[t])?[0], t.dtype()) else {
                continue;
            };
            let what = format!("batch tensor `{name}`");
            let f = bad.failure(Phase::Data, &format!("batch.{name}"), &what, "");
            return Ok(Err(f.with_stats(TensorStats::of_tensor(t)?)));
        }
        Ok(Ok(()))
    }

    /// The loss of the batch, computed by the user's closure.
    fn loss_phase(
        &mut self,
        batch: &Batch,
        loss_of: &mut impl FnMut(&Batch) -> CandleResult<Tensor>,
    ) -> Phased<(Tensor, f64)> {
        // Only an intervention makes an untraced tracer do anything.
        let shared = self
            .intervention
            .is_some()
            .then(|| crate::models::tracer::share(&self.tracer(false)));
        let loss = loss_of(batch);
        drop(shared);
        let loss = loss?;
        let value = scalar(&loss)?;
        self.trace.losses.push(value);
        match checks::loss(value, self.half(), "loss", || {
            format!("the loss is {value}")
        }) {
            Some(f) => Ok(Err(f)),
            None => Ok(Ok((loss, value))),
        }
    }

    /// Every gradient finite; the half-precision margins; the gradient
    /// norm into the history and the jump watch.
    fn gradient_phase<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        grads: &GradStore,
        (before, opt, exact): (&Before, &O, bool),
    ) -> Phased<()> {
        let grad = |v: &Var| {
            grads
                .get(v.as_tensor())
                .expect("every variable has a gradient")
        };
        // Scanned by the prepared update's pass where it read them all
        // (then the gradients are looked up only for a failure).
        let scans = match opt_grads(opt, &self.vars, exact) {
            Some(seen) => Cow::Borrowed(seen),
            None => Cow::Owned(scan_all(&self.vars.iter().map(grad).collect::<Vec<_>>())?),
        };
        if let Some(i) = checks::first_bad(&scans) {
            let g = grad(&self.vars[i]);
            let f = checks::gradient_failure(&self.names[i], &scans[i], self.half(), g)?;
            return Ok(Err(f));
        }
        // Outside half precision there is no margin to warn of.
        if self.half() {
            let dtypes: Vec<DType> = self.vars.iter().map(|v| v.dtype()).collect();
            let names = (&self.names[..], &dtypes[..]);
            checks::warn_half_margins(step, names, &scans, &mut self.trace.warnings);
        }
        let norm = global_norm(&scans);
        self.trace.grad_norms.push(norm);
        if let Some(was) = self.watch.gradient(norm) {
            let sum_sq: Vec<f64> = scans.iter().map(|s| s.sum_sq).collect();
            let leader = self.names[checks::explosion::largest(&sum_sq)].clone();
            self.saw_jump(step, Grew::GradientNorm, (was, norm), leader, (before, opt))?;
        }
        Ok(Ok(()))
    }

    /// The update, checked before it is set where the optimizer can say
    /// what it would be (nanhunt's), else after it: the parameters and the
    /// optimizer's state finite, the parameter norm into the history and
    /// the jump watch.
    fn update_phase<O: GuardOptimizer + ?Sized>(
        &mut self,
        step: usize,
        (grads, prepared, exact): (&GradStore, Option<Vec<Tensor>>, bool),
        opt: &mut O,
        before: &Before,
    ) -> Phased<()> {
        if prepared.is_none() {
            opt.apply(grads)?;
        }
        // The updated values in the guard's order, listed only where a
        // scan of its own, a failure or a jump needs them.
        let updated = || -> Vec<&Tensor> {
            match &prepared {
                Some(new) if exact => new.iter().collect(),
                // What the optimizer leaves as it is keeps its value.
                Some(new) => in_guard_order(&*opt, &self.vars, new),
                None => self.vars.iter().map(|v| v.as_tensor()).collect(),
            }
        };
        // A prepared update's own pass may have scanned what it wrote.
        let scans = match (&prepared, opt.prepared_scans()) {
            (Some(_), Some(seen)) if exact => Cow::Borrowed(&seen.params[..]),
            _ => Cow::Owned(scan_all(&updated())?),
        };
        if let Some(i) = checks::first_bad(&scans) {
            let which = Updated::Param(&self.names[i]);
            let failed = updated()[i].clone();
            let f = checks::update_failure(which, &scans[i], self.half(), &failed)?;
            return Ok(Err(self.at_update_op(f, opt, grads, &failed)?));
        }
        if let Some((f, t)) = self.state_failure(opt)? {
            return Ok(Err(self.at_update_op(f, opt, grads, &t)?));
        }
        let norm = global_norm(&scans);
        self.trace.param_norms.push(norm);
        if let Some(was) = self.watch.parameters(norm) {
            let leader = self.fastest_growing(&updated(), before)?;
            self.saw_jump(
                step,
                Grew::ParameterNorm,
                (was, norm),
                leader,
                (before, &*opt),
            )?;
        }
        if let Some(new) = prepared {
            opt.commit(new)?;
        }
        Ok(Ok(()))
    }

    /// The optimizer state a prepared update would leave, checked as the
    /// runner checks its optimizer's.
    fn state_failure<O: GuardOptimizer + ?Sized>(
        &self,
        opt: &O,
    ) -> Result<Option<(Failure, Tensor)>> {
        let Some((index, kind, t)) = opt.non_finite_prepared_state()? else {
            return Ok(None);
        };
        let names = super::optim::opt_var_names(opt, &self.vars, &self.names);
        let param = names.get(index).map_or("?", String::as_str);
        let which = Updated::State { kind, param };
        let scan = scan_all(&[&t])?[0];
        let f = checks::update_failure(which, &scan, self.half(), &t)?;
        Ok(Some((f, t)))
    }

    /// An update failure at the op of the optimizer's op chain that made
    /// `failed` (the same analysis as the runner's): the update prepared
    /// again with tracing on, where the optimizer prepares it (nanhunt's;
    /// nothing is set before the checks pass, so preparing it again
    /// changes nothing the step keeps).
    fn at_update_op<O: GuardOptimizer + ?Sized>(
        &self,
        first: Failure,
        opt: &mut O,
        grads: &GradStore,
        failed: &Tensor,
    ) -> Result<Failure> {
        if !opt.can_prepare() {
            return Ok(first);
        }
        let tracer = self.tracer(true);
        tracer.begin_update();
        let shared = crate::models::tracer::share(&tracer);
        let prepared = opt.prepare(grads);
        drop(shared);
        prepared?;
        let records = tracer.records();
        crate::localize::at_update_op(first, &records, (tracer.update_from(), Some(failed)))
    }

    /// The parameter whose norm grows the most in this update.
    fn fastest_growing(&self, updated: &[&Tensor], before: &Before) -> Result<String> {
        let earlier: Vec<&Tensor> = match &before.params {
            Some(params) => params.iter().collect(),
            None => self.vars.iter().map(|v| v.as_tensor()).collect(),
        };
        let i = checks::explosion::fastest_growing(updated, &earlier)?;
        Ok(self.names[i].clone())
    }
}

/// The gradients' scans of the prepared update's pass, where it read
/// every one of `vars`, in their order (`exact`: it updates exactly them).
fn opt_grads<'a, O: GuardOptimizer + ?Sized>(
    opt: &'a O,
    vars: &[Var],
    exact: bool,
) -> Option<&'a [TensorScan]> {
    let seen = opt.prepared_scans()?;
    (exact && seen.grads.len() == vars.len()).then_some(&seen.grads[..])
}

/// The values an update prepared in the optimizer's order, put in the
/// guard's; a variable the optimizer does not update keeps its value.
fn in_guard_order<'a, O: GuardOptimizer + ?Sized>(
    opt: &O,
    vars: &'a [Var],
    new: &'a [Tensor],
) -> Vec<&'a Tensor> {
    let order = opt.vars().unwrap_or_default();
    vars.iter()
        .map(|v| {
            let at = order
                .iter()
                .position(|o| o.as_tensor().id() == v.as_tensor().id());
            at.and_then(|i| new.get(i)).unwrap_or(v.as_tensor())
        })
        .collect()
}

/// A check's failure, if any, as a phase's result.
fn unless(failure: Option<Failure>) -> Phased<()> {
    Ok(match failure {
        Some(f) => Err(f),
        None => Ok(()),
    })
}

/// The loss as a number; the closure must return a scalar.
pub(super) fn scalar(loss: &Tensor) -> Result<f64> {
    if loss.elem_count() != 1 {
        return Err(Error::option(
            "loss",
            format!(
                "the step closure must return the scalar loss, got shape {:?}",
                loss.dims()
            ),
        ));
    }
    crate::probe::first_value(loss)
}
