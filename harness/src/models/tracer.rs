//! The tracer: named intermediate tensors recorded in execution order for
//! localization, and the thread-local through which a traced re-run
//! reaches stages recorded at any depth of a user's code
//! ([`crate::trace`], [`Tracer::current`]).

use crate::finding::{short_type_name, OpKind, OpSite, StageOp};
pub use crate::instrument::Operand;
use crate::instrument::{recording, set_recording, Site};
use crate::intervention::Intervention;
use candle_core::{Result, Tensor};
use std::cell::{Ref, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// Records named intermediate tensors ("block1.conv", "layer0.attn.softmax")
/// in execution order, for localization.
///
/// `record` returns the tensor the model must use downstream. With tracing
/// off it is the same tensor (no cost). With tracing on it is `t + z` for a
/// fresh zero variable `z` of the same shape: the forward value is unchanged
/// and, since candle keeps gradients only for variables, the gradient of `z`
/// after backward *is* the gradient of this stage's output.
///
/// The records are shared by the tracer's clones: while a traced re-run is
/// active, [`crate::trace`] (called anywhere in a user's code) records into
/// the same list, in execution order.
#[derive(Clone, Default)]
pub struct Tracer {
    enabled: bool,
    /// Records into the thread's active traced re-run, if any
    /// ([`Tracer::current`]).
    thread: bool,
    records: Rc<RefCell<Recorded>>,
    /// A guarded stage (diagnose's interventions): applied to the tensor a
    /// model continues with, whether or not tracing is on.
    intervention: Option<Arc<Intervention>>,
    /// What the intervention's stage read, kept between the two records
    /// for a repair that recomputes the stage (shared by the clones).
    read: Rc<RefCell<Option<Tensor>>>,
    /// The f32 values of a region of code the intervention computes in
    /// f32, between its ops (shared by the clones).
    wide: Rc<RefCell<crate::intervention::widen::Wide>>,
    /// The optimizer's update has begun (shared by the clones): its ops
    /// are not the model's, and half-precision storage leaves them alone.
    updating: Rc<std::cell::Cell<bool>>,
}

/// One recorded stage.
#[derive(Clone)]
#[non_exhaustive]
pub struct Record {
    /// The stage's name.
    pub name: String,
    /// What the stage computes, when the model declared it
    /// ([`Tracer::record_as`], [`crate::trace_as`]).
    pub op: Option<OpKind>,
    /// The stage's output.
    pub output: Tensor,
    /// The zero variable whose gradient is the gradient of `output`.
    pub grad_probe: candle_core::Var,
    /// An op of an instrumented function (`#[nanhunt::instrument]`): where
    /// it is. `None`: a stage recorded by name.
    pub site: Option<OpSite>,
    /// What an op read, in its operands' order (receiver first); empty for
    /// a stage recorded by name.
    pub inputs: Vec<Operand>,
}

/// The records of a traced re-run, and how ops get their names: an op is
/// named for the stage it flows into (the next record by name, `rownorm`
/// → `rownorm.div`), or, after the last one, for its function
/// (`Net::forward.log`); a repeated kind in one group is numbered
/// (`.exp`, `.exp#2`), so the names stay the same when unrelated lines move.
#[derive(Default)]
struct Recorded {
    records: Vec<Record>,
    /// The first op not yet grouped under a stage.
    ungrouped: usize,
    /// How many ops of each name so far.
    taken: HashMap<String, usize>,
    /// Where the optimizer's update began (its op chain's records follow).
    update_from: Option<usize>,
}

impl Recorded {
    fn unique(&mut self, base: String) -> String {
        let n = self.taken.entry(base.clone()).or_insert(0);
        *n += 1;
        match *n {
            1 => base,
            n => format!("{base}#{n}"),
        }
    }

    /// A stage is recorded: the ops since the last stage are its ops.
    fn push_stage(&mut self, r: Record) {
        let stage = r.name.clone();
        for i in self.ungrouped..self.records.len() {
            let Some(site) = &self.records[i].site else {
                continue;
            };
            let base = format!("{stage}.{}", site.kind);
            // The name it had until now is free again.
            let old = &self.records[i].name;
            let old = old.split('#').next().unwrap_or(old);
            if let Some(n) = self.taken.get_mut(old) {
                *n -= 1;
            }
            self.records[i].name = self.unique(base);
        }
        self.records.push(r);
        self.ungrouped = self.records.len();
    }

    fn push_op(&mut self, mut r: Record) {
        if let Some(site) = &r.site {
            r.name = self.unique(format!("{}.{}", site.function, site.kind));
        }
        self.records.push(r);
    }
}

impl Record {
    /// The stage's op: as declared, else as its name reads (marked so).
    pub fn stage_op(&self) -> Option<StageOp> {
        StageOp::of(&self.name, self.op)
    }
}

thread_local! {
    static TRACER: RefCell<Option<Tracer>> = const { RefCell::new(None) };
}

impl Tracer {
    /// A tracer that records nothing (the per-step default).
    pub fn off() -> Self {
        Tracer::default()
    }

    /// A tracer that records.
    pub fn on() -> Self {
        Tracer {
            enabled: true,
            ..Tracer::default()
        }
    }

    /// A tracer that records into the traced re-run active on this thread
    /// (the runner's, the guard's, `nanhunt::traced`), as
    /// [`crate::trace`] does, and costs one flag read otherwise: a model
    /// written against [`Tracer`] runs in a user's own guarded loop with
    /// `model.forward(x, &mut Tracer::current())`.
    pub fn current() -> Self {
        Tracer {
            thread: true,
            ..Tracer::default()
        }
    }

    /// This tracer, guarding the intervention's stages.
    pub fn with_intervention(mut self, intervention: Option<Arc<Intervention>>) -> Self {
        self.intervention = intervention;
        self
    }

    /// Whether `record` does anything (tracing or an intervention).
    #[inline]
    pub fn active(&self) -> bool {
        self.enabled || self.intervention.is_some() || (self.thread && recording())
    }

    /// Whether it records.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Records `t` under `name` when tracing is on; use the returned tensor.
    #[inline]
    pub fn record(&mut self, name: &str, t: Tensor) -> Result<Tensor> {
        if self.active() {
            self.push(name.to_string(), None, t)
        } else {
            Ok(t)
        }
    }

    /// Records `t` under `name` as the output of an `op` (a log, a norm,
    /// a softmax, ...): explanations read what the stage computed from the
    /// kind, not from its name.
    #[inline]
    pub fn record_as(&mut self, name: &str, op: OpKind, t: Tensor) -> Result<Tensor> {
        if self.active() {
            self.push(name.to_string(), Some(op), t)
        } else {
            Ok(t)
        }
    }

    /// Like [`Tracer::record`], but the name is only built when tracing is on.
    #[inline]
    pub fn record_with(&mut self, name: impl FnOnce() -> String, t: Tensor) -> Result<Tensor> {
        if self.active() {
            self.push(name(), None, t)
        } else {
            Ok(t)
        }
    }

    /// Like [`Tracer::record_as`], with the name built only when tracing is on.
    #[inline]
    pub fn record_with_as(
        &mut self,
        name: impl FnOnce() -> String,
        op: OpKind,
        t: Tensor,
    ) -> Result<Tensor> {
        if self.active() {
            self.push(name(), Some(op), t)
        } else {
            Ok(t)
        }
    }

    fn push(&mut self, name: String, op: Option<OpKind>, t: Tensor) -> Result<Tensor> {
        if self.thread {
            return record_active(&name, op, t);
        }
        if !self.enabled {
            return match &self.intervention {
                Some(iv) => iv.apply(&name, t, &self.read),
                None => Ok(t),
            };
        }
        let z = probe_like(&t, true)?;
        let mut out = (&t + z.as_tensor())?;
        // Guarded after the probe: the record holds what the model goes on
        // with, and the probe's gradient is the one the guard passed back.
        if let Some(iv) = &self.intervention {
            out = iv.apply(&name, out, &self.read)?;
        }
        self.records.borrow_mut().push_stage(Record {
            name,
            op,
            output: out.clone(),
            grad_probe: z,
            site: None,
            inputs: Vec::new(),
        });
        Ok(out)
    }

    /// The stages recorded so far, in execution order.
    pub fn records(&self) -> Ref<'_, Vec<Record>> {
        Ref::map(self.records.borrow(), |r| &r.records)
    }

    /// Marks where the update begins: the ops recorded from here on are
    /// the optimizer's (a traced re-run runs its op chain).
    pub fn begin_update(&self) {
        self.updating.set(true);
        if self.enabled {
            let mut r = self.records.borrow_mut();
            r.update_from = Some(r.records.len());
        }
    }

    /// The first record of the update, when one began.
    pub fn update_from(&self) -> Option<usize> {
        self.records.borrow().update_from
    }

    /// The records, in execution order.
    pub fn into_records(self) -> Vec<Record> {
        self.records.borrow().records.clone()
    }

    /// Records an instrumented op's output `t` (what it read: `inputs`);
    /// use the returned tensor downstream. Integer outputs (masks, ids)
    /// are kept without a gradient probe: no gradient reaches them.
    fn push_op(
        &mut self,
        site: &'static Site,
        owner: Option<&'static str>,
        inputs: Vec<Operand>,
        t: Tensor,
    ) -> Result<Tensor> {
        let op_site = OpSite::of(site, owner.map(short_type_name));
        // Half-precision storage rounds each op of the model as PyTorch
        // does (a view computes nothing; the update keeps its own dtype).
        let storage = match (&self.intervention, site.kind, self.updating.get()) {
            (Some(iv), k, false) if k != OpKind::View => iv.storage,
            _ => None,
        };
        let guarded = |t: Tensor| match (&self.intervention, t.dtype().is_float()) {
            (Some(iv), true) => {
                let t = iv.apply_op(&op_site, &inputs, t, &self.read, &self.wide)?;
                match storage {
                    Some(half) => t.to_dtype(half.dtype())?.to_dtype(t.dtype()),
                    None => Ok(t),
                }
            }
            _ => Ok(t),
        };
        if !self.enabled {
            return guarded(t);
        }
        // A view computes nothing and keeps its layout (a transpose read
        // by a matmul sums in its own order): no probe on it, so a traced
        // re-run computes the same bits. Its gradient is its input's.
        let probed = t.dtype().is_float() && site.kind != OpKind::View;
        let z = probe_like(&t, probed)?;
        let out = if probed { (&t + z.as_tensor())? } else { t };
        // Guarded after the probe, as a stage is.
        let out = guarded(out)?;
        self.records.borrow_mut().push_op(Record {
            name: String::new(),
            op: Some(site.kind),
            output: out.clone(),
            grad_probe: z,
            site: Some(op_site),
            inputs,
        });
        Ok(out)
    }
}

/// The zero variable a record's gradient is read from: -0.0, so that
/// `t + z` is `t` bit for bit (a -0.0 in `t` stays -0.0). A scalar
/// stands in for an integer tensor, which no gradient reaches.
fn probe_like(t: &Tensor, float: bool) -> Result<candle_core::Var> {
    if !float {
        return candle_core::Var::zeros((), candle_core::DType::F32, t.device());
    }
    let z = Tensor::zeros(t.shape(), t.dtype(), t.device())?.neg()?;
    candle_core::Var::from_tensor(&z)
}

/// Records `t` into the traced re-run active on this thread, if any;
/// otherwise hands it back at the cost of one flag read.
#[inline]
pub(crate) fn record_active(name: &str, op: Option<OpKind>, t: Tensor) -> Result<Tensor> {
    if !recording() {
        return Ok(t);
    }
    TRACER.with(|tr| match tr.borrow_mut().as_mut() {
        Some(tracer) if !tracer.thread => tracer.push(name.to_string(), op, t),
        _ => Ok(t),
    })
}

/// Records an instrumented op's output into the traced re-run active on
/// this thread, if any; otherwise hands it back (the instrument's sink).
fn record_op(
    site: &'static Site,
    owner: Option<&'static str>,
    inputs: Vec<Operand>,
    t: Tensor,
) -> Result<Tensor> {
    if !recording() {
        return Ok(t);
    }
    TRACER.with(|tr| match tr.borrow_mut().as_mut() {
        Some(tracer) if !tracer.thread && (tracer.enabled || tracer.intervention.is_some()) => {
            tracer.push_op(site, owner, inputs, t)
        }
        _ => Ok(t),
    })
}

/// While the returned value lives, [`record_active`] on this thread
/// records into `tracer` (whose clones share its records); the tracer
/// before is put back afterwards, even on a panic.
pub(crate) fn share(tracer: &Tracer) -> Shared {
    crate::instrument::set_sink(record_op);
    let outer = TRACER.with(|tr| tr.borrow_mut().replace(tracer.clone()));
    let was = set_recording(true);
    Shared { outer, was }
}

pub(crate) struct Shared {
    outer: Option<Tracer>,
    was: bool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let outer = self.outer.take();
        TRACER.with(|tr| *tr.borrow_mut() = outer);
        set_recording(self.was);
    }
}
