//! Localization from any depth: `nanhunt::trace("encoder.layer3.attn", t)`
//! anywhere in a user's code records a stage while a traced re-run is
//! active on this thread, and otherwise hands `t` back at the cost of one
//! thread-local flag read — no `&mut Tracer` threaded through `forward`.
//! Calls on other threads (inside a user's own rayon closure) are not
//! recorded: trace on the thread that runs the step.

use crate::models::Tracer;
use candle_core::{Result, Tensor};
use std::cell::{Cell, RefCell};

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static TRACER: RefCell<Option<Tracer>> = const { RefCell::new(None) };
}

/// Records `t` as the output of stage `name` when a traced re-run is
/// active on this thread; use the returned tensor downstream.
#[inline]
pub fn trace(name: &str, t: Tensor) -> Result<Tensor> {
    if !ACTIVE.with(Cell::get) {
        return Ok(t);
    }
    TRACER.with(|tr| match tr.borrow_mut().as_mut() {
        Some(tracer) => tracer.record(name, t),
        None => Ok(t),
    })
}

/// Like [`trace`], declaring what the stage computes (`OpKind::Log`,
/// `OpKind::Norm`, ...): explanations then read the kind, not the name.
#[inline]
pub fn trace_as(name: &str, op: crate::finding::OpKind, t: Tensor) -> Result<Tensor> {
    if !ACTIVE.with(Cell::get) {
        return Ok(t);
    }
    TRACER.with(|tr| match tr.borrow_mut().as_mut() {
        Some(tracer) => tracer.record_as(name, op, t),
        None => Ok(t),
    })
}

/// Runs `f` with tracing on for this thread; returns its result and the
/// stages it recorded.
pub fn traced<R>(f: impl FnOnce() -> R) -> (R, Tracer) {
    let tracer = Tracer::on();
    let shared = share(&tracer);
    let r = f();
    drop(shared);
    (r, tracer)
}

/// While the returned value lives, [`trace`] on this thread records into
/// `tracer` (whose clones share its records); the tracer before is put back
/// afterwards, even on a panic.
pub(crate) fn share(tracer: &Tracer) -> Shared {
    let outer = TRACER.with(|tr| tr.borrow_mut().replace(tracer.clone()));
    let was = ACTIVE.with(|a| a.replace(true));
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
        ACTIVE.with(|a| a.set(self.was));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn traces_only_inside_a_traced_run() {
        let t = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let out = trace("outside", t.clone()).unwrap();
        assert_eq!(out.id(), t.id(), "untraced: the same tensor");
        let (r, tracer) = traced(|| {
            let a = trace("a", t.clone()).unwrap();
            trace("a.b", (a * 2.0).unwrap()).unwrap()
        });
        let names: Vec<String> = tracer.records().iter().map(|r| r.name.clone()).collect();
        assert_eq!(names, ["a", "a.b"]);
        assert_eq!(r.to_vec1::<f32>().unwrap(), vec![2.0, 4.0]);
        assert_eq!(trace("after", t.clone()).unwrap().id(), t.id());
    }
}
