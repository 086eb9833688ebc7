//! Every fused kernel against its reference composition (values and the
//! gradients of every input, to the named tolerance, in f32 and f64) and
//! on the AVX2 and baseline vector builds (the widest build's bits exactly), the
//! finite-difference check on both versions, and the edge cases the
//! reference defines: odd sizes, even kernels, NaN and -inf inputs.

use super::*;
use crate::gradcheck::{check_function, TensorCheck};
use crate::rng::Rng;
use candle_core::{Device, Var};

fn randn(seed: u64, shape: &[usize], dtype: DType) -> Tensor {
    let mut rng = Rng::keyed(seed, "kernels.test", 0);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

type Op = dyn Fn(&[Tensor]) -> Result<Tensor>;

/// The output and the gradient of Σ w·y with respect to every input.
fn value_and_grads(kernels: Kernels, f: &Op, inputs: &[Tensor]) -> (Tensor, Vec<Tensor>) {
    with_kernels(kernels, || {
        let vars: Vec<Var> = inputs
            .iter()
            .map(|t| Var::from_tensor(t).unwrap())
            .collect();
        let xs: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let y = f(&xs).unwrap();
        let w = randn(99, y.dims(), y.dtype());
        let grads = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let gs = xs
            .iter()
            .map(|x| grads.get(x).expect("every input gets a gradient").clone())
            .collect();
        (y, gs)
    })
}

/// max |a - b| / max |b|, in f64.
fn scaled_error(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let a = a
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    let b = b
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-300);
    a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Fused and reference agree to the named tolerance in f32 and f64.
fn matches_reference(what: &str, f: &Op, shapes: &[&[usize]]) {
    matches_reference_within(what, f, shapes, |d| tolerance(d).unwrap())
}

fn matches_reference_within(what: &str, f: &Op, shapes: &[&[usize]], tol: impl Fn(DType) -> f64) {
    for dtype in [DType::F64, DType::F32] {
        let inputs: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| randn(i as u64 + 1, s, dtype))
            .collect();
        let (yf, gf) = value_and_grads(Kernels::Fused, f, &inputs);
        // The narrower builds give the widest build's bits.
        for narrower in [Vectors::Avx2, Vectors::Baseline] {
            let (yb, gb) = with_vectors(narrower, || value_and_grads(Kernels::Fused, f, &inputs));
            for (i, (a, b)) in std::iter::once((&yf, &yb))
                .chain(gf.iter().zip(&gb))
                .enumerate()
            {
                assert!(
                    same_tensor_bits(a, b),
                    "{what} {dtype:?}: the {:?} build ({}) differs from the widest ({}) in tensor {i}",
                    narrower,
                    narrower.isa().name(),
                    Vectors::Widest.isa().name()
                );
            }
        }
        let (yr, gr) = value_and_grads(Kernels::Reference, f, &inputs);
        let tol = tol(dtype);
        let err = scaled_error(&yf, &yr);
        assert!(
            err <= tol,
            "{what} {dtype:?}: output differs by {err:e} > {tol:e}"
        );
        for (i, (a, b)) in gf.iter().zip(&gr).enumerate() {
            let err = scaled_error(a, b);
            assert!(
                err <= tol,
                "{what} {dtype:?}: gradient {i} differs by {err:e} > {tol:e}"
            );
        }
    }
}

/// Whether two tensors hold the same bits (NaN payloads and signed zeros
/// included).
fn same_tensor_bits(a: &Tensor, b: &Tensor) -> bool {
    let bits = |t: &Tensor| -> Vec<u64> {
        let t = t.flatten_all().unwrap();
        match t.dtype() {
            DType::F32 => t
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits() as u64)
                .collect(),
            _ => t
                .to_vec1::<f64>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect(),
        }
    };
    a.dims() == b.dims() && bits(a) == bits(b)
}

fn assert_passes(what: &str, checks: &[TensorCheck]) {
    for c in checks {
        assert!(
            c.passed,
            "{what}: {} failed (has gradient: {}, max rel err {:e})",
            c.name, c.has_gradient, c.max_rel_err
        );
    }
}

/// The finite-difference check passes on both implementations.
fn gradchecks(what: &str, f: &Op, shapes: &[&[usize]]) {
    let inputs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| randn(i as u64 + 10, s, DType::F64))
        .collect();
    for kernels in [Kernels::Fused, Kernels::Reference] {
        let checks = with_kernels(kernels, || check_function(f, &inputs, 0).unwrap());
        assert_passes(&format!("{what} ({kernels:?})"), &checks);
    }
}

#[test]
fn linear_matches_reference_and_gradchecks() {
    let lin: &Op = &|xs| linear(&xs[0], &xs[1], &xs[2]);
    matches_reference("linear", lin, &[&[7, 5], &[3, 5], &[3]]);
    matches_reference("linear, rank 4", lin, &[&[2, 3, 4, 5], &[3, 5], &[3]]);
    gradchecks("linear", lin, &[&[4, 3], &[2, 3], &[2]]);
    gradchecks("linear, rank 3", lin, &[&[2, 2, 3], &[2, 3], &[2]]);
}

/// The linear map on (B, S, in) gives the bits of the same map over
/// rows with a reshape on each side (the graph before leading dimensions
/// were rows inside the op): the output and every gradient, where one
/// input feeds three maps (attention's q, k and v) whose gradients are
/// summed into it, and the outputs meet again downstream.
#[test]
fn linear_on_leading_dimensions_gives_the_bits_of_reshaped_rows() {
    for dtype in [DType::F32, DType::F64] {
        let x = randn(1, &[3, 5, 8], dtype);
        let ws: Vec<Tensor> = (0..3).map(|i| randn(2 + i, &[6, 8], dtype)).collect();
        let bs: Vec<Tensor> = (0..3).map(|i| randn(5 + i, &[6], dtype)).collect();
        let w_out = randn(9, &[3, 5, 6], dtype);
        let bits = |reshaped: bool| {
            let vars: Vec<Var> = std::iter::once(&x)
                .chain(&ws)
                .chain(&bs)
                .map(|t| Var::from_tensor(t).unwrap())
                .collect();
            let t: Vec<&Tensor> = vars.iter().map(|v| v.as_tensor()).collect();
            let map = |i: usize| {
                if reshaped {
                    let rows = t[0].reshape((15, 8)).unwrap();
                    linear(&rows, t[1 + i], t[4 + i])
                        .unwrap()
                        .reshape((3, 5, 6))
                        .unwrap()
                } else {
                    linear(t[0], t[1 + i], t[4 + i]).unwrap()
                }
            };
            let (q, k, v) = (map(0), map(1), map(2));
            let y = ((q * &k).unwrap().tanh().unwrap() + (k * v).unwrap()).unwrap();
            let grads = (y * &w_out).unwrap().sum_all().unwrap().backward().unwrap();
            t.iter()
                .map(|v| {
                    let g = grads.get(v).unwrap().flatten_all().unwrap();
                    let g = g.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
                    g.iter().map(|x| x.to_bits()).collect::<Vec<u64>>()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(false), bits(true), "{dtype:?}");
    }
}

fn conv(xs: &[Tensor]) -> Result<Tensor> {
    conv2d(&xs[0], &xs[1], &xs[2])
}

#[test]
fn conv2d_matches_reference_and_gradchecks() {
    // kernels 1, 2 (even: the output grows by one), 3 and 5 (wider than the
    // 4-pixel side, so whole rows of the patch are padding)
    for (k, side) in [(1, 5), (2, 5), (3, 6), (5, 4)] {
        let x: &[usize] = &[2, 3, side, side + 1];
        let w: &[usize] = &[4, 3, k, k];
        matches_reference(&format!("conv2d k={k}"), &conv, &[x, w, &[4]]);
    }
    gradchecks("conv2d", &conv, &[&[2, 2, 4, 5], &[3, 2, 3, 3], &[3]]);
    gradchecks("conv2d k=2", &conv, &[&[1, 2, 3, 3], &[2, 2, 2, 2], &[2]]);
}

#[test]
fn conv2d_on_data_gives_no_input_gradient_but_the_same_weight_gradient() {
    let x = randn(1, &[2, 3, 8, 8], DType::F32); // data: not a variable
    let w = Var::from_tensor(&randn(2, &[4, 3, 3, 3], DType::F32)).unwrap();
    let b = Var::from_tensor(&randn(3, &[4], DType::F32)).unwrap();
    let grads_of = |kernels| {
        with_kernels(kernels, || {
            let y = conv2d(&x, w.as_tensor(), b.as_tensor()).unwrap();
            y.sqr().unwrap().sum_all().unwrap().backward().unwrap()
        })
    };
    let (fused, reference) = (grads_of(Kernels::Fused), grads_of(Kernels::Reference));
    assert!(fused.get(&x).is_none(), "no gradient for the data input");
    for t in [w.as_tensor(), b.as_tensor()] {
        let err = scaled_error(fused.get(t).unwrap(), reference.get(t).unwrap());
        assert!(
            err <= TOLERANCE_F32,
            "parameter gradient differs by {err:e}"
        );
    }
}

#[test]
fn pooling_matches_reference_and_gradchecks() {
    let max: &Op = &|xs| pool2x2(&xs[0], PoolKind::Max);
    let avg: &Op = &|xs| pool2x2(&xs[0], PoolKind::Avg);
    for shape in [&[2, 3, 6, 8][..], &[1, 2, 5, 7]] {
        matches_reference("max_pool", max, &[shape]);
        matches_reference("avg_pool", avg, &[shape]);
    }
    gradchecks("max_pool", max, &[&[1, 2, 5, 6]]);
    gradchecks("avg_pool", avg, &[&[1, 2, 5, 6]]);
    // The activation fused in front of max pooling.
    let relu_max: &Op = &|xs| relu_max_pool2x2(&xs[0]);
    let gelu_max: &Op = &|xs| gelu_max_pool2x2(&xs[0]);
    for shape in [&[2, 3, 6, 8][..], &[1, 2, 5, 7]] {
        matches_reference("relu_max_pool", relu_max, &[shape]);
        matches_reference_within("gelu_max_pool", gelu_max, &[shape], gelu_tolerance);
    }
    gradchecks("relu_max_pool", relu_max, &[&[1, 2, 5, 6]]);
    gradchecks("gelu_max_pool", gelu_max, &[&[1, 2, 5, 6]]);
}

#[test]
fn max_pool_propagates_nan_and_gives_ties_one_gradient() {
    // The NaN in the second window: the first is pooled as usual, the
    // second gives the NaN, and its gradient goes to the NaN's position.
    let x = Var::new(
        &[[[[5f32, 4., 1., f32::NAN], [6., 7., 3., 2.]]]],
        &Device::Cpu,
    )
    .unwrap();
    let y = pool2x2(x.as_tensor(), PoolKind::Max).unwrap();
    let v = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(v[0], 7.0);
    assert!(v[1].is_nan());
    let g = y.sum_all().unwrap().backward().unwrap();
    let g = g.get(x.as_tensor()).unwrap().flatten_all().unwrap();
    assert_eq!(
        g.to_vec1::<f32>().unwrap(),
        [0., 0., 0., 1., 0., 1., 0., 0.]
    );
    // a window of equal values: the gradient goes to the first (PyTorch's rule)
    let tie = Var::new(&[[[[2f64, 2.], [2., 2.]]]], &Device::Cpu).unwrap();
    let g = pool2x2(tie.as_tensor(), PoolKind::Max)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = g.get(tie.as_tensor()).unwrap().flatten_all().unwrap();
    assert_eq!(g.to_vec1::<f64>().unwrap(), [1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn attention_products_match_reference_and_gradcheck() {
    for (heads, scale) in [(2, Some(0.7)), (1, None), (3, Some(1.0))] {
        let sc: &Op = &move |xs| attention_scores(&xs[0], &xs[1], heads, scale);
        let ctx: &Op = &move |xs| {
            let p = softmax_last_dim(&attention_scores(&xs[0], &xs[0], heads, None)?)?;
            attention_context(&p, &xs[1], heads)
        };
        let d = 2 * heads;
        matches_reference("attention_scores", sc, &[&[2, 5, 3 * d], &[2, 5, 3 * d]]);
        matches_reference("attention_context", ctx, &[&[2, 5, 3 * d], &[2, 5, 3 * d]]);
        gradchecks("attention_scores", sc, &[&[2, 3, d], &[2, 3, d]]);
        gradchecks("attention_context", ctx, &[&[2, 3, d], &[2, 3, d]]);
    }
}

#[test]
fn grouped_attention_matches_repeated_heads_and_gradchecks() {
    // 6 query heads over 2 and over 3 key/value heads, head width 2.
    for kv in [2, 3] {
        let heads = (6, kv);
        let sc: &Op = &move |xs| grouped_attention_scores(&xs[0], &xs[1], heads, Some(0.7));
        let ctx: &Op = &move |xs| {
            let p = softmax_last_dim(&grouped_attention_scores(&xs[0], &xs[1], heads, None)?)?;
            grouped_attention_context(&p, &xs[1], heads)
        };
        let (q, k) = (&[2, 5, 12][..], &[2, 5, 2 * kv][..]);
        matches_reference("grouped_attention_scores", sc, &[q, k]);
        matches_reference("grouped_attention_context", ctx, &[q, k]);
        gradchecks(
            "grouped_attention_scores",
            sc,
            &[&[2, 3, 12], &[2, 3, 2 * kv]],
        );
        gradchecks(
            "grouped_attention_context",
            ctx,
            &[&[2, 3, 12], &[2, 3, 2 * kv]],
        );
    }
    // The grouped kernel is the plain one on repeated key/value heads.
    let dev = Device::Cpu;
    let mut rng = Rng::new(3);
    let mut draw = |n: usize, shape: &[usize]| {
        let v: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        Tensor::from_vec(v, shape, &dev).unwrap()
    };
    let (q, k) = (draw(2 * 4 * 12, &[2, 4, 12]), draw(2 * 4 * 4, &[2, 4, 4]));
    let grouped = grouped_attention_scores(&q, &k, (6, 2), None).unwrap();
    let repeated = reference::repeat_kv(&k, 2, 6).unwrap();
    let plain = attention_scores(&q, &repeated, 6, None).unwrap();
    let diff = (grouped - plain).unwrap().abs().unwrap().max_all().unwrap();
    assert_eq!(diff.to_scalar::<f64>().unwrap(), 0.0);
}

#[test]
fn rms_norm_matches_reference_and_gradchecks() {
    let rms: &Op = &|xs| rms_norm(&xs[0], &xs[1], 1e-5);
    matches_reference("rms_norm", rms, &[&[2, 5, 16], &[16]]);
    gradchecks("rms_norm", rms, &[&[2, 3, 6], &[6]]);
}

#[test]
fn swiglu_matches_reference_and_gradchecks() {
    let f: &Op = &|xs| swiglu(&xs[0], &xs[1]);
    matches_reference("swiglu", f, &[&[2, 5, 16], &[2, 5, 16]]);
    gradchecks("swiglu", f, &[&[2, 3, 6], &[2, 3, 6]]);
}

#[test]
fn rope_gradchecks_and_rotates_each_pair_by_its_angle() {
    const S: usize = 3;
    let s = S;
    let f: &Op = &|xs| {
        let angles: Vec<f64> = (0..S * 2).map(|i| 0.3 * i as f64).collect();
        let t = Tensor::from_vec(angles, (S, 2), xs[0].device())?.to_dtype(xs[0].dtype())?;
        rope(&xs[0], &t.cos()?, &t.sin()?)
    };
    matches_reference("rope", f, &[&[2, s, 2, 4]]);
    gradchecks("rope", f, &[&[2, s, 2, 4]]);
    // On (B, S, heads·hd): the same values and gradients as on (B, S, H, hd).
    let merged: &Op = &|xs| {
        let angles: Vec<f64> = (0..S * 2).map(|i| 0.3 * i as f64).collect();
        let t = Tensor::from_vec(angles, (S, 2), xs[0].device())?.to_dtype(xs[0].dtype())?;
        rope_heads(&xs[0], 2, &t.cos()?, &t.sin()?)?.reshape((2, S, 2, 4))
    };
    let split: &Op = &|xs| f(&[xs[0].reshape((2, S, 2, 4))?]);
    for dtype in [DType::F32, DType::F64] {
        let x = randn(3, &[2, s, 8], dtype);
        let a = value_and_grads(Kernels::Fused, merged, std::slice::from_ref(&x));
        let b = value_and_grads(Kernels::Fused, split, std::slice::from_ref(&x));
        assert_eq!(scaled_error(&a.0, &b.0), 0.0);
        assert_eq!(scaled_error(&a.1[0], &b.1[0]), 0.0);
    }
    matches_reference("rope on merged heads", merged, &[&[2, s, 8]]);
    // A rotation keeps each pair's norm.
    let x = randn(1, &[1, s, 1, 4], DType::F64);
    let y = f(std::slice::from_ref(&x)).unwrap();
    let norms = |t: &Tensor| {
        t.sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    assert!((norms(&x) - norms(&y)).abs() < 1e-12);
}

#[test]
fn layer_norm_matches_reference_and_gradchecks() {
    let ln: &Op = &|xs| layer_norm(&xs[0], &xs[1], &xs[2], 1e-5);
    matches_reference("layer_norm", ln, &[&[2, 5, 16], &[16], &[16]]);
    gradchecks("layer_norm", ln, &[&[2, 3, 6], &[6], &[6]]);
}

#[test]
fn softmax_matches_reference_gradchecks_and_keeps_masked_rows() {
    let sm: &Op = &|xs| softmax_last_dim(&xs[0]);
    matches_reference("softmax", sm, &[&[2, 4, 7, 7]]);
    gradchecks("softmax", sm, &[&[3, 5]]);
    let inf = f32::INFINITY;
    let x = Tensor::new(
        &[
            [0f32, -inf, 1.],
            [-inf, -inf, -inf],
            [f32::NAN, 0., 0.],
            [inf, 0., 0.],
        ],
        &Device::Cpu,
    )
    .unwrap();
    let row = |k| {
        with_kernels(k, || {
            softmax_last_dim(&x).unwrap().to_vec2::<f32>().unwrap()
        })
    };
    let (fused, reference) = (row(Kernels::Fused), row(Kernels::Reference));
    assert_eq!(fused[0][1], 0.0, "a masked entry gets no weight");
    for (f, r) in fused.iter().zip(&reference).skip(1) {
        // all -inf, NaN and +inf rows: NaN in both
        assert_eq!(
            f.iter().map(|v| v.is_nan()).collect::<Vec<_>>(),
            r.iter().map(|v| v.is_nan()).collect::<Vec<_>>()
        );
    }
}

/// The causal softmax gives the bits of the fused softmax after a causal
/// `where_cond` (the graph the attention had): values and the scores'
/// gradient, with NaN, ±inf and a large row among the scores, and an
/// upstream gradient with inf and NaN at blocked keys (which `where_cond`
/// drops); under the reference switch it is that composition.
#[test]
fn causal_softmax_gives_the_bits_of_mask_then_softmax() {
    for dtype in [DType::F32, DType::F64] {
        let mut x = randn(4, &[2, 3, 6, 6], DType::F64).to_vec1_flat();
        x[7] = f64::NAN;
        x[40] = f64::INFINITY;
        x[75] = f64::NEG_INFINITY;
        x[90..96].iter_mut().for_each(|v| *v *= 1e3);
        let mut w = randn(5, &[2, 3, 6, 6], DType::F64).to_vec1_flat();
        w[1] = f64::INFINITY; // row 0, key 1: blocked
        w[50] = f64::NAN; // row 8 (query 2), key 2: open
        w[53] = f64::NAN; // row 8, key 5: blocked
        let shape = (2, 3, 6, 6);
        let x = Tensor::from_vec(x, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let w = Tensor::from_vec(w, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let bits = |fused: bool| {
            let v = Var::from_tensor(&x).unwrap();
            let y = if fused {
                causal_softmax(v.as_tensor()).unwrap()
            } else {
                let mask = reference::causal_mask(6, &Device::Cpu)
                    .unwrap()
                    .broadcast_as(shape)
                    .unwrap();
                let blocked = Tensor::new(f32::NEG_INFINITY, &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .broadcast_as(shape)
                    .unwrap();
                softmax_last_dim(&mask.where_cond(v.as_tensor(), &blocked).unwrap()).unwrap()
            };
            let g = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let g = g.get(v.as_tensor()).unwrap().clone();
            [y, g].map(|t| t.value_bits())
        };
        assert_eq!(bits(true), bits(false), "{dtype:?}");
    }
    let f: &Op = &|xs| causal_softmax(&xs[0]);
    matches_reference("causal softmax", f, &[&[2, 2, 5, 5]]);
    gradchecks("causal softmax", f, &[&[1, 2, 4, 4]]);
}

/// The key-masked softmax gives the bits of the broadcast add and the
/// fused softmax (values and the scores' gradient, with BERT's -1e4 mask,
/// NaN and ±inf among the scores); against the reference composition and
/// with a tracked mask (which takes the composition) it passes the
/// tolerance and the finite-difference check.
#[test]
fn key_masked_softmax_gives_the_bits_of_add_then_softmax() {
    for dtype in [DType::F32, DType::F64] {
        let mut x = randn(8, &[2, 3, 4, 5], DType::F64).to_vec1_flat();
        x[3] = f64::NAN;
        x[30] = f64::INFINITY;
        x[77] = f64::NEG_INFINITY;
        let x = Tensor::from_vec(x, (2, 3, 4, 5), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let add = Tensor::new(
            &[[0.0, 0.0, -1e4, 0.0, -1e4], [0.0, -1e4, -1e4, -1e4, -1e4]],
            &Device::Cpu,
        )
        .unwrap()
        .reshape((2, 1, 1, 5))
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
        let w = randn(9, &[2, 3, 4, 5], dtype);
        let bits = |fused: bool| {
            with_kernels(Kernels::Fused, || {
                let v = Var::from_tensor(&x).unwrap();
                let y = if fused {
                    key_masked_softmax(v.as_tensor(), &add).unwrap()
                } else {
                    softmax_last_dim(&v.as_tensor().broadcast_add(&add).unwrap()).unwrap()
                };
                let g = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
                [y, g.get(v.as_tensor()).unwrap().clone()].map(|t| t.value_bits())
            })
        };
        assert_eq!(bits(true), bits(false), "{dtype:?}");
    }
    let f: &Op = &|xs| key_masked_softmax(&xs[0], &xs[1]);
    matches_reference("key-masked softmax", f, &[&[2, 2, 3, 4], &[2, 1, 1, 4]]);
    gradchecks("key-masked softmax", f, &[&[1, 2, 3, 4], &[1, 1, 1, 4]]);
}

/// The mean over positions gives candle's `mean(1)` bits, value and
/// gradient (a ±1e-300 weight gives signed zeros in f32).
#[test]
fn mean_positions_gives_the_bits_of_mean_over_dim_1() {
    for dtype in [DType::F32, DType::F64] {
        let mut x = randn(6, &[3, 7, 5], DType::F64).to_vec1_flat();
        x[4] = f64::NAN;
        x[12] = f64::INFINITY;
        x[40] = -0.0;
        let x = Tensor::from_vec(x, (3, 7, 5), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        for weight in [1.0, -2.5, 1e-300] {
            let w = (randn(7, &[3, 5], dtype) * weight).unwrap();
            let bits = |k: Kernels| {
                with_kernels(k, || {
                    let v = Var::from_tensor(&x).unwrap();
                    let y = mean_positions(v.as_tensor()).unwrap();
                    let g = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
                    [y, g.get(v.as_tensor()).unwrap().clone()].map(|t| t.value_bits())
                })
            };
            assert_eq!(
                bits(Kernels::Fused),
                bits(Kernels::Reference),
                "{dtype:?} {weight}"
            );
        }
    }
}

/// A tensor's values in order, as f64.
trait Flat {
    fn to_vec1_flat(&self) -> Vec<f64>;
    /// The values' f64 bits, every NaN as one value (as the probe reads
    /// them); f32 → f64 is exact, so equal bits are equal f32 bits.
    fn value_bits(&self) -> Vec<u64> {
        self.to_vec1_flat()
            .iter()
            .map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
            .collect()
    }
}

impl Flat for Tensor {
    fn to_vec1_flat(&self) -> Vec<f64> {
        self.flatten_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    }
}

#[test]
fn lstm_cell_matches_reference_and_gradchecks() {
    let a: &Op = &|xs| lstm_activate(&xs[0]);
    matches_reference("lstm_activate", a, &[&[3, 20]]);
    gradchecks("lstm_activate", a, &[&[2, 12]]);
    let c: &Op = &|xs| lstm_c(&lstm_activate(&xs[0])?, &xs[1]);
    let h: &Op = &|xs| lstm_h(&lstm_activate(&xs[0])?, &xs[1]);
    for (name, op) in [("lstm_c", c), ("lstm_h", h)] {
        matches_reference(name, op, &[&[3, 20], &[3, 5]]);
        gradchecks(name, op, &[&[2, 12], &[2, 3]]);
    }
}

#[test]
fn lstm_layer_matches_reference_and_gradchecks() {
    let layer: &Op = &|xs| lstm_layer(&xs[0], &xs[1], &xs[2], &xs[3], &xs[4]);
    // Every step's output carries a gradient (the weights in
    // `value_and_grads`), so both paths of the backward recurrence are used.
    let (x, w_ih, w_hh, b): (&[usize], &[usize], &[usize], &[usize]) =
        (&[3, 6, 4], &[20, 4], &[20, 5], &[20]);
    matches_reference("lstm_layer", layer, &[x, w_ih, b, w_hh, b]);
    let (x, w_ih, w_hh, b): (&[usize], &[usize], &[usize], &[usize]) =
        (&[2, 1, 3], &[8, 3], &[8, 2], &[8]);
    matches_reference("lstm_layer, one step", layer, &[x, w_ih, b, w_hh, b]);
    gradchecks(
        "lstm_layer",
        layer,
        &[&[2, 4, 3], &[8, 3], &[8], &[8, 2], &[8]],
    );
}

#[test]
fn gru_layer_matches_reference_and_gradchecks() {
    let layer: &Op = &|xs| gru_layer(&xs[0], &xs[1], &xs[2], &xs[3], &xs[4]);
    let (x, w_ih, w_hh, b): (&[usize], &[usize], &[usize], &[usize]) =
        (&[3, 6, 4], &[15, 4], &[15, 5], &[15]);
    matches_reference("gru_layer", layer, &[x, w_ih, b, w_hh, b]);
    let (x, w_ih, w_hh, b): (&[usize], &[usize], &[usize], &[usize]) =
        (&[2, 1, 3], &[6, 3], &[6, 2], &[6]);
    matches_reference("gru_layer, one step", layer, &[x, w_ih, b, w_hh, b]);
    gradchecks(
        "gru_layer",
        layer,
        &[&[2, 4, 3], &[6, 3], &[6], &[6, 2], &[6]],
    );
}

#[test]
fn tanh_rnn_layer_matches_reference_and_gradchecks() {
    let layer: &Op = &|xs| tanh_rnn_layer(&xs[0], &xs[1], &xs[2], &xs[3], &xs[4]);
    let (x, w_ih, w_hh, b): (&[usize], &[usize], &[usize], &[usize]) =
        (&[3, 6, 4], &[5, 4], &[5, 5], &[5]);
    matches_reference("tanh_rnn_layer", layer, &[x, w_ih, b, w_hh, b]);
    gradchecks(
        "tanh_rnn_layer",
        layer,
        &[&[2, 4, 3], &[2, 3], &[2], &[2, 2], &[2]],
    );
}

#[test]
fn gru_cell_matches_reference_and_gradchecks() {
    let n: &Op = &|xs| gru_n(&xs[0], &xs[1], &xs[2]);
    let h: &Op = &|xs| gru_h(&xs[0], &xs[1], &xs[2]);
    matches_reference("gru_n", n, &[&[3, 10], &[3, 15], &[3, 15]]);
    matches_reference("gru_h", h, &[&[3, 10], &[3, 5], &[3, 5]]);
    gradchecks("gru_n", n, &[&[2, 6], &[2, 9], &[2, 9]]);
    gradchecks("gru_h", h, &[&[2, 6], &[2, 3], &[2, 3]]);
}

#[test]
fn reference_is_used_for_half_precision_and_under_the_switch() {
    let x = randn(1, &[2, 8], DType::F16);
    assert!(!fused_for(&x), "f16 keeps the reference composition");
    let x = randn(1, &[2, 8], DType::F32);
    assert!(fused_for(&x));
    assert!(!with_kernels(Kernels::Reference, || fused_for(&x)));
    assert!(fused_for(&x), "the switch is scoped");
}

#[test]
fn tanh_f32_is_within_a_few_ulp_everywhere() {
    // every 97th f32 bit pattern over [-10, 10], plus the specials (worst
    // measured: 5.8 ulp near 5.76, where an ulp is 6e-8)
    let (mut worst_ulp, mut at) = (0f64, 0f32);
    let mut bits = 0u32;
    while bits < 0x4120_0000 {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            let exact = (x as f64).tanh();
            let ulp = (exact as f32).abs().max(f32::MIN_POSITIVE);
            let ulp = (f32::from_bits(ulp.to_bits() + 1) - ulp) as f64;
            let err = (tanh_f32(x) as f64 - exact).abs() / ulp;
            if err > worst_ulp {
                (worst_ulp, at) = (err, x);
            }
        }
        bits += 97;
    }
    assert!(worst_ulp <= 7.0, "tanh_f32 is {worst_ulp} ulp off at {at}");
    assert!(tanh_f32(f32::NAN).is_nan());
    assert_eq!(tanh_f32(f32::INFINITY), 1.0);
    assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
    assert_eq!(tanh_f32(0.0), 0.0);
}

#[test]
fn exp_f32_is_within_2_ulp_everywhere() {
    // every 31st f32 bit pattern whose e^x is finite and not 0 (subnormal
    // results included, where an ulp is 1.4e-45), plus the edges
    let (mut worst_ulp, mut at) = (0f64, 0f32);
    let mut bits = 0u32;
    while bits < 0x42b0_0000 {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            if !(-103.0..=88.72).contains(&x) {
                continue;
            }
            let exact = (x as f64).exp();
            let ulp = (exact as f32).min(f32::MAX / 2.0);
            let ulp = (f32::from_bits(ulp.to_bits() + 1) - ulp) as f64;
            let err = (exp_f32(x) as f64 - exact).abs() / ulp;
            if err > worst_ulp {
                (worst_ulp, at) = (err, x);
            }
        }
        bits += 31;
    }
    assert!(worst_ulp <= 2.0, "exp_f32 is {worst_ulp} ulp off at {at}");
    assert!(exp_f32(f32::NAN).is_nan());
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_f32(89.0), f32::INFINITY);
    assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_f32(-110.0), 0.0);
    assert!(exp_f32(-100.0) > 0.0, "subnormal results are kept");
    assert_eq!(exp_f32(88.8), f32::INFINITY);
    assert_eq!(exp_f32(0.0), 1.0);
}

#[test]
fn gelu_matches_reference_and_gradchecks() {
    let g: &Op = &|xs| gelu(&xs[0]);
    matches_reference_within("gelu", g, &[&[3, 4, 5]], gelu_tolerance);
    gradchecks("gelu", g, &[&[4, 6]]);
}

/// candle's GELU backward rounds 1/√(2π) to 0.398942 (a relative error of
/// 7e-7 in one term), so in f64 the gradients agree to that, not to
/// TOLERANCE_F64; the values and the f32 results meet the named ones.
fn gelu_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-6,
        _ => TOLERANCE_F32,
    }
}

#[test]
fn erf_f32_is_within_5e7_of_erf() {
    let mut worst = 0f64;
    let mut x = -6.0f32;
    while x <= 6.0 {
        worst = worst.max((erf_f32(x) as f64 - libm::erf(x as f64)).abs());
        x += 1e-4;
    }
    assert!(worst < 5e-7, "erf_f32 is {worst:e} off"); // measured: 4.0e-7
    assert!(erf_f32(f32::NAN).is_nan());
    assert_eq!(erf_f32(f32::INFINITY), 1.0);
}

#[test]
fn tanh_matches_reference_and_gradchecks() {
    let t: &Op = &|xs| tanh(&xs[0]);
    matches_reference("tanh", t, &[&[3, 4, 5]]);
    gradchecks("tanh", t, &[&[4, 6]]);
}

#[test]
fn relu_matches_reference_and_gradchecks() {
    let r: &Op = &|xs| relu(&xs[0]);
    matches_reference("relu", r, &[&[3, 4, 5]]);
    gradchecks("relu", r, &[&[4, 6]]);
}

/// The gradient of `sum(f(x))` at x = [NaN, 0, -1, 2], on both paths.
fn value_and_slope(f: fn(&Tensor) -> candle_core::Result<Tensor>) -> [(Vec<f32>, Vec<f32>); 2] {
    [Kernels::Fused, Kernels::Reference].map(|k| {
        with_kernels(k, || {
            let x = Var::new(&[f32::NAN, 0.0, -1.0, 2.0], &Device::Cpu).unwrap();
            let y = f(x.as_tensor()).unwrap();
            let g = y.sum_all().unwrap().backward().unwrap();
            let g = g.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
            (y.to_vec1::<f32>().unwrap(), g)
        })
    })
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn relu_has_slope_zero_at_zero_on_both_paths() {
    // The common convention (PyTorch, TensorFlow, JAX), and relu(NaN) = 0.
    for (y, g) in value_and_slope(relu) {
        assert_eq!(y, [0.0, 0.0, 0.0, 2.0]);
        assert_eq!(g, [0.0, 0.0, 0.0, 1.0]);
    }
}

#[test]
fn leaky_relu_has_its_negative_slope_at_zero_on_both_paths() {
    for (y, g) in value_and_slope(leaky_relu) {
        assert!(y[0].is_nan(), "leaky(NaN) = NaN, got {}", y[0]);
        assert!(same_bits(&y[1..], &[0.0, -0.01, 2.0]), "{y:?}");
        assert!(same_bits(&g, &[0.01, 0.01, 0.01, 1.0]), "{g:?}");
    }
    let l: &Op = &|xs| leaky_relu(&xs[0]);
    matches_reference("leaky_relu", l, &[&[3, 4, 5]]);
    gradchecks("leaky_relu", l, &[&[4, 6]]);
}

/// candle's own rule, which the built-in activations deliberately do not
/// follow (docs/INTERNALS.md names it). When this fails, candle changed
/// its convention: update the docs and this test.
#[test]
fn candle_relu_keeps_slope_one_at_zero() {
    let x = Var::new(&[0.0f32, -1.0, 2.0], &Device::Cpu).unwrap();
    let g = x
        .as_tensor()
        .relu()
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        g.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap(),
        [1.0, 0.0, 1.0]
    );
}

/// The loss and the gradients of `weight · loss` with respect to the logits
/// and (when `track_targets`) the targets, as the bits of f64 values.
fn cross_entropy_bits(
    kernels: Kernels,
    z: &Tensor,
    t: &Tensor,
    weight: f64,
    track_targets: bool,
) -> Vec<Vec<u64>> {
    with_kernels(kernels, || {
        let z = Var::from_tensor(z).unwrap();
        let t = if track_targets {
            Var::from_tensor(t).unwrap().as_tensor().clone()
        } else {
            t.clone()
        };
        let loss = cross_entropy(z.as_tensor(), &t).unwrap();
        let grads = (&loss * weight).unwrap().backward().unwrap();
        let mut out = vec![&loss, grads.get(z.as_tensor()).unwrap()];
        if track_targets {
            out.push(grads.get(&t).expect("tracked targets get a gradient"));
        }
        out.into_iter().map(Flat::value_bits).collect()
    })
}

/// Row i of `rows` × `classes` targets: one-hot, smoothed one-hot, a
/// spread distribution, all zero (a masked row), a negative weight.
fn targets(rows: usize, classes: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng::keyed(seed, "kernels.test.targets", 0);
    let mut t = vec![0.0; rows * classes];
    for (i, row) in t.chunks_exact_mut(classes).enumerate() {
        let hot = rng.below(classes);
        match i % 5 {
            0 => row[hot] = 1.0,
            1 => {
                row.iter_mut().for_each(|v| *v = 0.1 / classes as f64);
                row[hot] += 0.9;
            }
            2 => {
                let w: Vec<f64> = (0..classes).map(|_| rng.uniform()).collect();
                let sum: f64 = w.iter().sum();
                row.iter_mut().zip(w).for_each(|(v, w)| *v = w / sum);
            }
            3 => {}
            _ => row[hot] = -0.5,
        }
    }
    t
}

/// The fused cross-entropy gives the reference composition's bits: the
/// loss, the logits' gradient and the targets', in f32 and f64, over row
/// widths that exercise candle's vector sums and their tails, scales up
/// to where exp underflows, special values (NaN first and later in a
/// row, ±inf, an all -inf row, −0) and upstream gradients of 1, 0.37,
/// -2.5 and ±1e-300 (zero in f32: signed zeros everywhere). (A weight of
/// exactly 0 leaves candle's graph without a gradient at all.)
#[test]
fn cross_entropy_gives_the_reference_bits() {
    let inf = f64::INFINITY;
    for dtype in [DType::F32, DType::F64] {
        for (rows, classes, scale) in [(40, 64, 1.0), (25, 37, 30.0), (10, 5, 1e4), (8, 1, 1.0)] {
            let mut z = randn(rows as u64, &[rows * classes], DType::F64)
                .to_vec1::<f64>()
                .unwrap();
            z.iter_mut().for_each(|v| *v *= scale);
            if classes >= 5 {
                // specials in rows 3..8 (each row a different kind)
                let row = |i: usize| i * classes;
                z[row(3)] = f64::NAN;
                z[row(4) + 2] = f64::NAN;
                z[row(5) + 1] = inf;
                z[row(6) + 3] = -inf;
                z[row(7)..row(8)].iter_mut().for_each(|v| *v = -inf);
                z[row(2) + 1] = -0.0;
            }
            let shape = (rows, classes);
            let z = Tensor::from_vec(z, shape, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let t = Tensor::from_vec(targets(rows, classes, 7), shape, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            for weight in [1.0, 0.37, -2.5, 1e-300, -1e-300] {
                for track in [false, true] {
                    let fused = cross_entropy_bits(Kernels::Fused, &z, &t, weight, track);
                    let reference = cross_entropy_bits(Kernels::Reference, &z, &t, weight, track);
                    for (what, (f, r)) in ["loss", "dz", "dt"]
                        .iter()
                        .zip(fused.iter().zip(&reference))
                    {
                        let first = f.iter().zip(r).position(|(a, b)| a != b);
                        assert!(
                            first.is_none(),
                            "{dtype:?} {rows}x{classes} scale {scale} weight {weight} track {track}: \
                             {what} differs first at {first:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn cross_entropy_falls_back_to_the_reference_where_it_does_not_apply() {
    // f16, a rank-3 input and mismatched shapes take the composition.
    let z = randn(1, &[4, 3], DType::F16);
    let t = Tensor::from_vec(targets(4, 3, 1), (4, 3), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let fused = cross_entropy(&z, &t).unwrap().to_dtype(DType::F32).unwrap();
    let reference = reference::cross_entropy(&z, &t)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    assert_eq!(
        fused.to_scalar::<f32>().unwrap().to_bits(),
        reference.to_scalar::<f32>().unwrap().to_bits()
    );
    let z3 = randn(2, &[2, 2, 3], DType::F32);
    let t3 = Tensor::zeros((2, 2, 3), DType::F32, &Device::Cpu).unwrap();
    assert!(cross_entropy(&z3, &t3).is_ok());
    assert!(cross_entropy(
        &randn(3, &[4, 3], DType::F32),
        &randn(4, &[4, 2], DType::F32)
    )
    .is_err());
}

/// The embedding (repeated ids, so rows' gradients add up) and the added
/// positions give the bits of candle's index select, reshape and
/// broadcast add: the output and the table's and the positions' gradients,
/// with NaN, inf and -0 among the values.
#[test]
fn embedding_and_positions_give_the_bits_of_the_composition() {
    // Three in the batch and an id four times: order shows in a sum of three.
    let ids = vec![3u32, 0, 3, 1, 1, 3, 2, 0, 4, 3, 0, 2];
    let ids = Tensor::from_vec(ids, (3, 4), &Device::Cpu).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let mut table = randn(11, &[5, 6], DType::F64).to_vec1_flat();
        table[7] = f64::NAN;
        table[20] = -0.0;
        table[25] = f64::INFINITY;
        let table = Tensor::from_vec(table, (5, 6), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let pos = randn(12, &[4, 6], dtype);
        for weight in [1.0, -2.5, 1e-300] {
            let w = (randn(13, &[3, 4, 6], dtype) * weight).unwrap();
            let bits = |k: Kernels| {
                with_kernels(k, || {
                    let (t, p) = (
                        Var::from_tensor(&table).unwrap(),
                        Var::from_tensor(&pos).unwrap(),
                    );
                    let e = embedding(t.as_tensor(), &ids).unwrap();
                    let y = add_positions(&e, p.as_tensor()).unwrap();
                    let g = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
                    let grad = |v: &Var| g.get(v.as_tensor()).unwrap().value_bits();
                    (e.value_bits(), y.value_bits(), grad(&t), grad(&p))
                })
            };
            assert_eq!(
                bits(Kernels::Fused),
                bits(Kernels::Reference),
                "{dtype:?} {weight}"
            );
        }
    }
}

#[test]
fn embedding_and_positions_match_reference_and_gradcheck() {
    let f: &Op = &|xs| add_positions(&xs[0], &xs[1]);
    matches_reference("add_positions", f, &[&[3, 4, 5], &[4, 5]]);
    gradchecks("add_positions", f, &[&[2, 3, 2], &[3, 2]]);
    let ids = Tensor::from_vec(vec![2u32, 0, 2, 1], (2, 2), &Device::Cpu).unwrap();
    let f: &Op = &move |xs| embedding(&xs[0], &ids);
    matches_reference("embedding", f, &[&[3, 4]]);
    gradchecks("embedding", f, &[&[3, 2]]);
}

/// An id past the table is an error that names it, not a panic.
#[test]
fn an_embedding_id_out_of_range_is_an_error() {
    let table = randn(14, &[3, 2], DType::F32);
    let ids = Tensor::from_vec(vec![0u32, 3], 2, &Device::Cpu).unwrap();
    let err = embedding(&table, &ids).unwrap_err().to_string();
    assert!(err.contains("id 3 at position 1"), "{err}");
    assert!(with_kernels(Kernels::Reference, || embedding(&table, &ids)).is_err());
}
