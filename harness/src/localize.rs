//! First-producer localization over a traced step.
//!
//! The runner re-runs a failing step with the tracer on. Forward stages are
//! recorded in execution order, so the first non-finite record is the first
//! producer (its input, the previous record or the checked batch, was
//! finite). Backward goes the other way: walking the records from the last
//! to the first, the first whose *gradient* is non-finite received it from
//! the backward pass of the stage right after it (or of the loss, for the
//! last record), which is therefore the producer. Stages that only pass a
//! NaN along are never blamed.
//!
//! With the ops of `#[nanhunt::instrument]`ed code among the records, the
//! analysis follows what each op read ([`OpGraph`]): forward, the producer
//! is the first op on the failing value's path that made a kind of
//! non-finite value none of its inputs held (a −inf from finite values, a
//! NaN from infinities); backward, the first op (from the loss back)
//! whose output's gradient is finite while the gradient of something it
//! read is not, every reader of that being finite too (else the bad
//! gradient was passed on, not made).

use crate::checks;
use crate::error::Result;
use crate::finding::{Failure, OpKind, Phase, StageOp};
use crate::models::graph::{NonFinite, OpGraph, Read};
use crate::models::Record;
use crate::probe::{scan_all, TensorScan};
use candle_core::backprop::GradStore;
use candle_core::Tensor;

/// The first forward record that is not finite.
pub fn first_forward(records: &[Record]) -> Result<Option<(usize, TensorScan)>> {
    let outputs: Vec<&Tensor> = records.iter().map(|r| &r.output).collect();
    let scans = scan_all(&outputs)?;
    Ok(scans.into_iter().enumerate().find(|(_, s)| !s.is_finite()))
}

/// Without records: the scan of the first non-finite tensor in the graph
/// that made `output`, in execution order (candle's topological order,
/// reversed), so an overflow that a later op turned into NaN (∞ − ∞, 0·∞)
/// is still seen as the overflow it was. `None` when every node is finite.
pub fn first_in_graph(output: &Tensor) -> Result<Option<TensorScan>> {
    let nodes = output.sorted_nodes();
    let scans = scan_all(&nodes.iter().rev().copied().collect::<Vec<_>>())?;
    Ok(scans.into_iter().find(|s| !s.is_finite()))
}

/// A stage whose backward pass produced a non-finite gradient.
pub struct BackwardProducer {
    /// The indices in the records of the stage whose backward op produced
    /// it (`None`: the loss's backward) and of the receiver.
    pub stage_index: Option<usize>,
    pub receiver_index: usize,
    /// The record whose output gradient is the first non-finite one.
    pub receiver: String,
    pub grad: Tensor,
    pub scan: TensorScan,
}

impl BackwardProducer {
    /// The finding's detail, the producing stage being named `stage`.
    pub fn detail(&self, stage: &str) -> String {
        format!(
            "the backward pass of `{stage}` made the gradient of `{}` non-finite",
            self.receiver
        )
    }
}

/// Walks the records' gradients from the output back to the input.
pub fn first_backward(records: &[Record], grads: &GradStore) -> Result<Option<BackwardProducer>> {
    // (index, gradient) of the records that are on the path to the loss.
    let with_grad: Vec<(usize, &Tensor)> = records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| grads.get(r.grad_probe.as_tensor()).map(|g| (i, g)))
        .collect();
    let tensors: Vec<&Tensor> = with_grad.iter().map(|(_, g)| *g).collect();
    let scans = scan_all(&tensors)?;
    // Downstream first: the last record's gradient is computed first.
    let mut downstream: Option<usize> = None;
    for ((i, g), scan) in with_grad.iter().zip(scans).rev() {
        if !scan.is_finite() {
            return Ok(Some(BackwardProducer {
                stage_index: downstream,
                receiver_index: *i,
                receiver: records[*i].name.clone(),
                grad: (*g).clone(),
                scan,
            }));
        }
        downstream = Some(*i);
    }
    Ok(None)
}

/// The first producer of a traced step's forward failure: the first
/// non-finite record, with the explanation of what it computed; `None`
/// when every record is finite. `inputs` are what the first record may
/// have read (the model's input, or a user's batch).
pub fn forward_producer(
    records: &[Record],
    inputs: &[&Tensor],
    half: bool,
) -> Result<Option<Failure>> {
    let g = OpGraph::new(records);
    if g.has_ops() {
        return forward_op_producer(&g, inputs, half);
    }
    let Some((i, scan)) = first_forward(records)? else {
        return Ok(None);
    };
    let r = &records[i];
    let f = checks::tensor_failure(
        &scan,
        half,
        Phase::Forward,
        r.name.clone(),
        &format!(
            "stage `{}` produced non-finite values from finite inputs",
            r.name
        ),
        &r.output,
    )?;
    let e = crate::explain::forward(records, i, inputs)?;
    Ok(Some(f.with_op(r.stage_op()).with_explanation(e)))
}

/// The first record at or after `from` on the path of the last non-finite
/// one that made a class of non-finite values its inputs did not hold (or
/// the first non-finite one on that path), with the classes it read.
fn first_maker(g: &OpGraph, from: usize, inputs: &[&Tensor]) -> Result<Option<(usize, NonFinite)>> {
    first_maker_before(g, from, None, inputs)
}

/// [`first_maker`] on the path of record `last` (default: the last
/// non-finite record).
fn first_maker_before(
    g: &OpGraph,
    from: usize,
    last: Option<usize>,
    inputs: &[&Tensor],
) -> Result<Option<(usize, NonFinite)>> {
    let records = g.records;
    let classes = records
        .iter()
        .map(|r| NonFinite::of(&r.output))
        .collect::<Result<Vec<_>>>()?;
    let last = last.or_else(|| classes.iter().rposition(|c| c.any()));
    let Some(last) = last.filter(|&l| l >= from) else {
        return Ok(None);
    };
    let on_path = g.ancestors(last);
    let mut read_classes = vec![NonFinite::default(); last + 1];
    for (i, c) in read_classes.iter_mut().enumerate().skip(from) {
        *c = classes_read(g, i, &classes, inputs)?;
    }
    let bad = |i: &usize| on_path[*i] && classes[*i].any();
    Ok((from..=last)
        .filter(bad)
        .find(|&i| classes[i].new_over(read_classes[i]).any())
        .or_else(|| (from..=last).find(bad))
        .map(|i| (i, read_classes[i])))
}

/// An update failure at the op of the optimizer's op chain that made it
/// (the records from `from` on, on the path of the record that holds the
/// failing tensor's values `failed`), with its line and explanation; the
/// failure as it was when no op there made it.
pub fn at_update_op(
    first: Failure,
    records: &[Record],
    (from, failed): (Option<usize>, Option<&Tensor>),
) -> Result<Failure> {
    let Some(from) = from else {
        return Ok(first);
    };
    let g = OpGraph::new(records);
    let holder = match failed {
        Some(t) => g.holding(t, from)?,
        None => None,
    };
    let Some((i, _)) = first_maker_before(&g, from, holder, &[])? else {
        return Ok(first);
    };
    let r = &records[i];
    let Some(site) = &r.site else {
        return Ok(first);
    };
    let detail = format!(
        "{}; the update's {} `{}` at {} made it",
        first.detail,
        crate::rules::walk::op_word(&site.op),
        site.short_text(60),
        site.location()
    );
    let e = crate::rules::explain_forward(&g, i, &[])?;
    Ok(Failure {
        detail,
        site: r.site.clone(),
        ..first
    }
    .with_explanation(e))
}

/// The forward producer among records that hold ops: the first record on
/// the path of the last non-finite one that made a class of non-finite
/// values its inputs did not hold.
fn forward_op_producer(g: &OpGraph, inputs: &[&Tensor], half: bool) -> Result<Option<Failure>> {
    let records = g.records;
    let Some((i, read)) = first_maker(g, 0, inputs)? else {
        return Ok(None);
    };
    let r = &records[i];
    let scan = scan_all(&[&r.output])?[0];
    let made = NonFinite::of(&r.output)?;
    let what = if !read.any() {
        "non-finite values from finite inputs"
    } else if made.new_over(read).any() {
        "new non-finite values from the infinities it read"
    } else {
        "non-finite values from non-finite values it read (made by no instrumented op before it)"
    };
    let detail = match &r.site {
        Some(s) => format!(
            "the {} `{}` at {} made {what}",
            crate::rules::walk::op_word(&s.op),
            s.short_text(60),
            s.location()
        ),
        None => format!("stage `{}` produced {what}", r.name),
    };
    let f = checks::tensor_failure(
        &scan,
        half,
        Phase::Forward,
        r.name.clone(),
        &detail,
        &r.output,
    )?;
    let e = match r.site {
        Some(_) => crate::rules::explain_forward(g, i, inputs)?,
        None => crate::explain::forward(records, i, inputs)?,
    };
    Ok(Some(
        f.with_op(r.stage_op())
            .with_site(r.site.clone())
            .with_explanation(e),
    ))
}

/// The classes of non-finite values record `i` read: its operands' (a
/// record's classes, or a tensor's own), or for the first record without
/// operands, the model's inputs'.
fn classes_read(
    g: &OpGraph,
    i: usize,
    classes: &[NonFinite],
    inputs: &[&Tensor],
) -> Result<NonFinite> {
    let reads = g.reads(i);
    let mut c = NonFinite::default();
    if reads.is_empty() && g.records[i].site.is_none() {
        for t in inputs.iter().filter(|t| t.dtype().is_float()) {
            c = c.union(NonFinite::of(t)?);
        }
        return Ok(c);
    }
    for r in reads {
        c = c.union(match r.from {
            Some(j) => classes[j],
            None if r.tensor.dtype().is_float() => NonFinite::of(r.tensor)?,
            None => NonFinite::default(),
        });
    }
    Ok(c)
}

/// The backward producer among records that hold ops (see the module
/// docs): the op, which of its operands' gradient it made non-finite, and
/// that gradient.
fn backward_op<'g>(
    g: &OpGraph,
    grads: &'g GradStore,
) -> Result<Option<(usize, usize, &'g Tensor)>> {
    let finite = |t: &Tensor| -> Result<bool> { Ok(scan_all(&[t])?[0].is_finite()) };
    for i in (0..g.records.len()).rev() {
        if g.records[i].site.is_none() {
            continue;
        }
        let Some(out) = g.grad(grads, i) else {
            continue;
        };
        if !finite(out)? {
            continue;
        }
        for (k, read) in g.reads(i).iter().enumerate() {
            let Some(grad) = g.grad_of_read(grads, read) else {
                continue;
            };
            if finite(grad)? || !readers_finite(g, grads, read)? {
                continue;
            }
            return Ok(Some((i, k, grad)));
        }
    }
    Ok(None)
}

/// Whether every op that read `read`'s tensor has a finite gradient of
/// its own output (so none passed a bad gradient on to it).
fn readers_finite(g: &OpGraph, grads: &GradStore, read: &Read) -> Result<bool> {
    let id = read.tensor.id();
    for (i, r) in g.records.iter().enumerate() {
        let reads_it = match r.site {
            Some(_) => crate::models::Operand::tensors(&r.inputs).any(|t| t.id() == id),
            None => read.from.is_some_and(|j| i == j + 1),
        };
        if !reads_it {
            continue;
        }
        if let Some(gr) = g.grad(grads, i) {
            if !scan_all(&[gr])?[0].is_finite() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The producer of a traced step's first non-finite gradient: the stage
/// whose backward pass made it, with its explanation, or the loss's
/// backward (`loss_stage`) for the last record's; `None` when every
/// recorded gradient is finite.
pub fn backward_producer(
    records: &[Record],
    grads: &GradStore,
    half: bool,
    loss_stage: &str,
) -> Result<Option<Failure>> {
    let g = OpGraph::new(records);
    if g.has_ops() {
        if let Some((i, k, grad)) = backward_op(&g, grads)? {
            let r = &records[i];
            let read = g.reads(i)[k];
            let what = match read.from {
                Some(j) => format!("`{}`", records[j].name),
                None => "a tensor it read".to_string(),
            };
            let detail = match &r.site {
                Some(s) => format!(
                    "the backward pass of the {} `{}` at {} made the gradient of {what} non-finite",
                    crate::rules::walk::op_word(&s.op),
                    s.short_text(60),
                    s.location()
                ),
                None => format!(
                    "the backward pass of `{}` made the gradient of {what} non-finite",
                    r.name
                ),
            };
            let scan = scan_all(&[grad])?[0];
            let f = checks::tensor_failure(
                &scan,
                half,
                Phase::Backward,
                r.name.clone(),
                &detail,
                grad,
            )?
            .with_op(r.stage_op())
            .with_site(r.site.clone())
            .with_explanation(crate::rules::explain_backward(&g, i, k, grad, &[])?);
            return Ok(Some(f));
        }
    }
    let Some(p) = first_backward(records, grads)? else {
        return Ok(None);
    };
    let (stage, op) = match p.stage_index {
        Some(s) => (records[s].name.clone(), records[s].stage_op()),
        None => (
            loss_stage.to_string(),
            Some(StageOp::declared(OpKind::Loss)),
        ),
    };
    let f = checks::tensor_failure(
        &p.scan,
        half,
        Phase::Backward,
        stage.clone(),
        &p.detail(&stage),
        &p.grad,
    )?
    .with_op(op);
    Ok(Some(match p.stage_index {
        Some(s) => f.with_explanation(crate::explain::backward(
            records,
            s,
            p.receiver_index,
            &p.grad,
        )?),
        None => f,
    }))
}
