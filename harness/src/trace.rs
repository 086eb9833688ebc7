//! Localization from any depth: `nanhunt::trace("encoder.layer3.attn", t)`
//! anywhere in a user's code records a stage while a traced re-run is
//! active on this thread, and otherwise hands `t` back at the cost of one
//! thread-local flag read — no `&mut Tracer` threaded through `forward`.
//! Calls on other threads (inside a user's own rayon closure) are not
//! recorded: trace on the thread that runs the step.

use crate::finding::OpKind;
use crate::models::tracer::{record_active, share};
use crate::models::Tracer;
use candle_core::{Result, Tensor};

/// Records `t` as the output of stage `name` when a traced re-run is
/// active on this thread; use the returned tensor downstream.
#[inline]
pub fn trace(name: &str, t: Tensor) -> Result<Tensor> {
    record_active(name, None, t)
}

/// Like [`trace`], declaring what the stage computes (`OpKind::Log`,
/// `OpKind::Norm`, ...): explanations then read the kind, not the name.
#[inline]
pub fn trace_as(name: &str, op: OpKind, t: Tensor) -> Result<Tensor> {
    record_active(name, Some(op), t)
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
