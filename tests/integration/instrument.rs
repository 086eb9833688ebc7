//! `#[nanhunt::instrument]` on the shapes users write: method chains with
//! `?`, operators on references and on values, closures, generics, early
//! returns, loops, a body with no tensors, functions that return something
//! other than a tensor, methods (the op's function names its type), and
//! values that share a tensor method's name (`f64::max`, an iterator's
//! `sum`). Each compiles, computes what the same code without the attribute
//! computes (traced or not), and records the ops it should, with their lines.

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Linear, VarBuilder, VarMap};
use nanhunt::models::Record;
use nanhunt::OpKind;

fn x() -> Tensor {
    Tensor::new(&[[1f32, -2.0, 3.0], [0.5, 0.0, -1.5]], &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// The kinds, ops and lines `f` records, and its result untraced and traced.
fn recorded<R>(f: impl Fn() -> R) -> (R, R, Vec<Record>) {
    let untraced = f();
    let (traced, tracer) = nanhunt::traced(f);
    (untraced, traced, tracer.into_records())
}

fn kinds(records: &[Record]) -> Vec<(OpKind, String)> {
    records
        .iter()
        .filter_map(|r| r.site.as_ref().map(|s| (s.kind, s.op.clone())))
        .collect()
}

// ---- method chains with `?`, operators on references and on values ----

/// Defines `$name` with `#[nanhunt::instrument]` and `$plain` without it,
/// from one body.
macro_rules! twins {
    ($name:ident, $plain:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        #[nanhunt::instrument]
        fn $name($($arg: $ty),*) -> $ret $body
        fn $plain($($arg: $ty),*) -> $ret $body
    };
}

twins!(chain, chain_plain, (x: &Tensor) -> candle_core::Result<Tensor> {
    let e = x.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let scaled = (&e * 2.0)?;
    let shifted = (scaled - 1.0)?;
    let ratio = (&shifted / &e)?;
    ratio.broadcast_add(&x.mean_keepdim(1)?)
});

#[test]
fn method_chains_and_operators_on_references_and_values() {
    let x = x();
    let (a, b, records) = recorded(|| chain(&x).unwrap());
    let want = values(&chain_plain(&x).unwrap());
    assert_eq!(values(&a), want);
    assert_eq!(values(&b), want, "the traced run computes the same bits");
    assert_eq!(
        kinds(&records),
        [
            (OpKind::Exp, "exp".into()),
            (OpKind::Reduce, "sum_keepdim".into()),
            (OpKind::Log, "log".into()),
            (OpKind::Mul, "*".into()),
            (OpKind::Sub, "-".into()),
            (OpKind::Div, "/".into()),
            (OpKind::Reduce, "mean_keepdim".into()),
            (OpKind::Add, "broadcast_add".into()),
        ]
    );
    // Each op is at its line, with the text as written, and reads what it read.
    let log = &records[2];
    let site = log.site.as_ref().unwrap();
    assert_eq!(site.file, "tests/integration/instrument.rs");
    assert_eq!(site.text, "x.exp()?.sum_keepdim(D::Minus1)?.log()");
    assert_eq!(site.function, "chain");
    assert_eq!(
        records[3].site.as_ref().unwrap().line,
        site.line + 1,
        "`&e * 2.0` is on the next line"
    );
    let read: Vec<_> = nanhunt::models::Operand::tensors(&log.inputs).collect();
    assert_eq!(read.len(), 1);
    assert_eq!(
        read[0].id(),
        records[1].output.id(),
        "the log read the sum's output"
    );
    let scalars: Vec<f64> = nanhunt::models::Operand::scalars(&records[3].inputs).collect();
    assert_eq!(scalars, [2.0], "the literal factor is recorded");
}

// ---- closures, loops, early returns, `Vec<Tensor>`, indexing ----

twins!(closures_and_loops, closures_and_loops_plain, (x: &Tensor, early: bool) -> candle_core::Result<Tensor> {
    let softplus = |t: &Tensor| (t.exp()? + 1.0)?.log();
    if early {
        return softplus(x);
    }
    let mut parts = Vec::new();
    for j in 0..x.dim(1)? {
        let col = x.narrow(1, j, 1)?;
        parts.push((col * (j as f64 + 1.0))?);
    }
    let stacked = Tensor::cat(&parts, 1)?;
    let first = (&parts[0] + 1.0)?;
    let total: f64 = (0..3).map(|i| i as f64 * 0.5).sum();
    (stacked.broadcast_mul(&first)? + total)?.tanh()
});

#[test]
fn closures_loops_early_returns_and_lists_of_tensors() {
    let x = x();
    for early in [true, false] {
        let (a, b, records) = recorded(|| closures_and_loops(&x, early).unwrap());
        let want = values(&closures_and_loops_plain(&x, early).unwrap());
        assert_eq!((values(&a), values(&b)), (want.clone(), want));
        let ops: Vec<OpKind> = kinds(&records).into_iter().map(|k| k.0).collect();
        if early {
            assert_eq!(ops, [OpKind::Exp, OpKind::Add, OpKind::Log]);
        } else {
            // Three narrowed columns scaled, the concatenation of the list
            // (which read all three), ...; the integer and f64 arithmetic
            // in between is no op.
            assert_eq!(ops.iter().filter(|&&k| k == OpKind::View).count(), 4);
            let cat = records
                .iter()
                .find(|r| r.site.as_ref().is_some_and(|s| s.op == "cat"))
                .unwrap();
            assert_eq!(
                nanhunt::models::Operand::tensors(&cat.inputs).count(),
                3,
                "the concatenation read its three parts"
            );
            assert_eq!(*ops.last().unwrap(), OpKind::Activation);
        }
    }
}

// ---- generics, a body with no tensors, non-tensor results ----

#[nanhunt::instrument]
fn generic<T: AsRef<Tensor>>(t: T, k: f64) -> candle_core::Result<Tensor> {
    t.as_ref().sqr()?.affine(k, 0.0)
}

#[nanhunt::instrument]
fn no_tensors(values: &[f64]) -> f64 {
    let mut acc = 0.0;
    for v in values {
        acc = acc + v.max(0.0) * 2.0 - 1.0 / 4.0;
    }
    let n = values.len() as f64;
    acc / n + values.iter().sum::<f64>() + (values.len() - 1) as f64
}

#[nanhunt::instrument]
fn statistics(x: &Tensor) -> candle_core::Result<(f32, Vec<f32>)> {
    let m = x.mean_all()?.to_scalar::<f32>()?;
    let rows = x.sum(1)?.to_vec1::<f32>()?;
    Ok((m * 2.0, rows))
}

#[test]
fn generics_bodies_without_tensors_and_other_results() {
    let x = x();
    let (a, b, records) = recorded(|| generic(&x, 3.0).unwrap());
    let want: Vec<f32> = values(&x).iter().map(|v| v * v * 3.0).collect();
    assert_eq!((values(&a), values(&b)), (want.clone(), want));
    assert_eq!(kinds(&records).len(), 2);
    let (a, b, records) = recorded(|| no_tensors(&[1.0, -2.0, 3.0]));
    let plain = {
        let values = [1.0f64, -2.0, 3.0];
        let mut acc = 0.0;
        for v in values {
            acc = acc + v.max(0.0) * 2.0 - 1.0 / 4.0;
        }
        acc / 3.0 + values.iter().sum::<f64>() + 2.0
    };
    assert_eq!((a, b), (plain, plain));
    assert!(records.is_empty(), "numbers are no ops");
    let (a, b, records) = recorded(|| statistics(&x).unwrap());
    assert_eq!(a, b);
    assert_eq!(a.0, values(&x).iter().sum::<f32>() / 6.0 * 2.0);
    assert_eq!(kinds(&records).len(), 2, "the mean and the row sums");
}

// ---- methods: the function names its type; modules' forward ----

struct Head {
    fc: Linear,
    scale: f64,
}

impl Head {
    #[nanhunt::instrument]
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.fc.forward(x)?;
        let z = (h * self.scale)?;
        candle_nn::ops::softmax(&z, D::Minus1)?.log()
    }
}

trait Scorer {
    #[nanhunt::instrument]
    fn score(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.sqr()?.sum_keepdim(1)?.sqrt()
    }
}

impl Scorer for Head {}

#[test]
fn methods_name_their_type_and_modules_are_ops() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let head = Head {
        fc: candle_nn::linear(3, 4, vb.pp("fc")).unwrap(),
        scale: 2.0,
    };
    let x = x();
    let (a, b, records) = recorded(|| head.forward(&x).unwrap());
    assert_eq!(values(&a), values(&b));
    let names: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "Head::forward.layer",
            "Head::forward.mul",
            "Head::forward.softmax",
            "Head::forward.log"
        ]
    );
    let scalars: Vec<f64> = nanhunt::models::Operand::scalars(&records[1].inputs).collect();
    assert_eq!(
        scalars,
        [2.0],
        "a field's f64 is recorded as the scalar it is"
    );
    let (_, _, records) = recorded(|| head.score(&x).unwrap());
    assert_eq!(records[2].name, "Head::score.sqrt");
}

// ---- stages group the ops before them ----

#[nanhunt::instrument]
fn staged(x: &Tensor) -> candle_core::Result<Tensor> {
    let norm = x.sqr()?.sum_keepdim(1)?.sqrt()?;
    let h = nanhunt::trace("rownorm", x.broadcast_div(&norm)?)?;
    let a = h.exp()?;
    let b = (h * 3.0)?.exp()?;
    a + b
}

#[test]
fn a_traced_stage_names_the_ops_before_it_and_repeats_are_numbered() {
    let (_, _, records) = recorded(|| staged(&x()).unwrap());
    let names: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "rownorm.mul",
            "rownorm.reduce",
            "rownorm.sqrt",
            "rownorm.div",
            "rownorm",
            "staged.exp",
            "staged.mul",
            "staged.exp#2",
            "staged.add"
        ]
    );
}

// ---- indexed receivers, views ----

struct Layers {
    states: Vec<Tensor>,
    layer: usize,
}

impl Layers {
    #[nanhunt::instrument]
    fn step(&mut self, x: &Tensor) -> candle_core::Result<Tensor> {
        // An indexed receiver and an indexed assignment, by a field and by
        // arithmetic: read as places, not moved out of the vector.
        let shifted = self.states[self.layer].broadcast_sub(x)?;
        self.states[self.layer + 1 - 1] = (&shifted * 0.5)?;
        self.states[self.layer].matmul(&x.t()?)
    }
}

#[test]
fn indexed_receivers_are_places_and_views_keep_their_layout() {
    let x = x();
    let mut layers = Layers {
        states: vec![x.clone(), x.clone()],
        layer: 1,
    };
    let (out, tracer) = nanhunt::traced(|| layers.step(&x).unwrap());
    let want: Vec<f32> = {
        let s = ((&x - &x).unwrap() * 0.5).unwrap();
        values(&s.matmul(&x.t().unwrap()).unwrap())
    };
    assert_eq!(values(&out), want);
    let records = tracer.into_records();
    // The transpose is recorded as the very tensor candle made (strided,
    // no probe added), so the matmul reads it as the untraced run does.
    let t = records
        .iter()
        .find(|r| r.site.as_ref().is_some_and(|s| s.op == "t"))
        .unwrap();
    assert!(!t.output.is_contiguous(), "a view keeps its layout");
    assert_eq!(t.site.as_ref().unwrap().kind, OpKind::View);
}
