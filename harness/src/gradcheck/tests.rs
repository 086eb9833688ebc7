//! Finite-difference checks of every layer type, every loss and each whole
//! family, plus proof that the checker catches candle's known-broken ops.

use super::*;
use crate::models::layers::{self, BatchNorm2d, Conv2d, LayerNorm, Linear};
use crate::spec::*;
use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;

fn randn(seed: u64, shape: &[usize]) -> Tensor {
    let mut rng = Rng::keyed(seed, "gradcheck.test", 0);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn assert_passes(what: &str, checks: &[TensorCheck]) {
    for c in checks {
        assert!(
            c.passed,
            "{what}: {} failed (has gradient: {}, max rel err {:e}, max abs err {:e})",
            c.name, c.has_gradient, c.max_rel_err, c.max_abs_err
        );
    }
}

/// A VarBuilder over the given named tensors (the inputs under check).
fn vb(names: &[&str], xs: &[Tensor]) -> VarBuilder<'static> {
    let map: HashMap<String, Tensor> = names
        .iter()
        .zip(xs)
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    VarBuilder::from_tensors(map, DType::F64, &Device::Cpu)
}

const INIT: InitSpec = InitSpec {
    scheme: InitScheme::Kaiming,
    gain: 1.0,
};

#[test]
fn linear_on_matrices_and_sequences() {
    for x_shape in [&[4, 3][..], &[2, 5, 3]] {
        let inputs = [randn(1, x_shape), randn(2, &[2, 3]), randn(3, &[2])];
        let checks = check_function(
            |xs| Linear::new(vb(&["weight", "bias"], &xs[1..]), &INIT, 3, 2)?.forward(&xs[0]),
            &inputs,
            0,
        )
        .unwrap();
        assert_passes("linear", &checks);
    }
}

#[test]
fn conv2d_kernels_3_and_1() {
    for k in [3, 1] {
        let inputs = [
            randn(1, &[2, 3, 5, 5]),
            randn(2, &[4, 3, k, k]),
            randn(3, &[4]),
        ];
        let checks = check_function(
            |xs| Conv2d::new(vb(&["weight", "bias"], &xs[1..]), &INIT, 3, 4, k)?.forward(&xs[0]),
            &inputs,
            0,
        )
        .unwrap();
        assert_passes("conv2d", &checks);
    }
}

#[test]
fn layer_norm_and_batch_norm() {
    let inputs = [randn(1, &[2, 3, 6]), randn(2, &[6]), randn(3, &[6])];
    let checks = check_function(
        |xs| LayerNorm::new(vb(&["weight", "bias"], &xs[1..]), 6, 1e-5)?.forward(&xs[0]),
        &inputs,
        0,
    )
    .unwrap();
    assert_passes("layer_norm", &checks);
    let inputs = [randn(4, &[3, 2, 4, 4]), randn(5, &[2]), randn(6, &[2])];
    let checks = check_function(
        |xs| BatchNorm2d::new(vb(&["weight", "bias"], &xs[1..]), 2, 1e-5)?.forward(&xs[0]),
        &inputs,
        0,
    )
    .unwrap();
    assert_passes("batch_norm", &checks);
}

#[test]
fn activations() {
    for act in [
        Activation::Relu,
        Activation::Gelu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::LeakyRelu,
    ] {
        let checks =
            check_function(|xs| layers::activate(&xs[0], act), &[randn(1, &[4, 5])], 0).unwrap();
        assert_passes(&format!("{act:?}"), &checks);
    }
}

#[test]
fn softmax_log_softmax_and_pools() {
    let x = randn(1, &[2, 3, 6, 6]);
    let odd = randn(2, &[2, 3, 7, 5]);
    type Op = fn(&Tensor) -> candle_core::Result<Tensor>;
    let ops: [(&str, Op, &Tensor); 6] = [
        ("softmax", layers::softmax, &x),
        ("log_softmax", layers::log_softmax, &x),
        ("max_pool2x2", layers::max_pool2x2, &x),
        ("max_pool2x2 odd", layers::max_pool2x2, &odd),
        ("avg_pool2x2", layers::avg_pool2x2, &odd),
        ("global_avg_pool", layers::global_avg_pool, &x),
    ];
    for (name, op, input) in ops {
        let checks = check_function(|xs| op(&xs[0]), std::slice::from_ref(input), 0).unwrap();
        assert_passes(name, &checks);
    }
}

#[test]
fn max_pool_gradient_sums_to_the_window_count() {
    // Each 2×2 window routes its unit gradient to one input: 36 windows on 12×12.
    let x = candle_core::Var::from_tensor(&randn(3, &[1, 1, 12, 12])).unwrap();
    let y = layers::max_pool2x2(x.as_tensor())
        .unwrap()
        .sum_all()
        .unwrap();
    let g = y
        .backward()
        .unwrap()
        .get(x.as_tensor())
        .unwrap()
        .sum_all()
        .unwrap();
    assert_eq!(g.to_scalar::<f64>().unwrap(), 36.0);
}

#[test]
fn every_loss() {
    let specs = [
        LossSpec::CrossEntropy {
            label_smoothing: 0.1,
        },
        LossSpec::NaiveCrossEntropy { eps: 1e-7 },
        LossSpec::Nll,
        LossSpec::Mse {
            root: false,
            eps: 0.0,
        },
        LossSpec::Mse {
            root: true,
            eps: 1e-6,
        },
        LossSpec::Huber { delta: 0.5 },
        LossSpec::Bce { eps: 1e-7 },
        LossSpec::BceWithLogits,
        LossSpec::KlDiv { eps: 1e-8 },
        LossSpec::PoissonNll {
            log_input: true,
            eps: 0.0,
        },
        LossSpec::PoissonNll {
            log_input: false,
            eps: 1e-8,
        },
        LossSpec::LogOneMinus { eps: 1e-7 },
    ];
    for spec in specs {
        let mut rng = Rng::new(7);
        let labels = [0, 2, 1, 2];
        let t = crate::data::dense_targets(&labels, 3, spec.target_kind(), &mut rng);
        let t = Tensor::from_vec(t, (4, 3), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap();
        let positive = matches!(
            spec,
            LossSpec::PoissonNll {
                log_input: false,
                ..
            }
        );
        let checks = check_function(
            |xs| {
                // Keep z > 0 where the loss takes a log of it.
                let z = if positive {
                    (xs[0].abs()? + 0.5)?
                } else {
                    xs[0].clone()
                };
                losses::loss(&spec, &z, &t)
            },
            &[randn(9, &[4, 3])],
            0,
        )
        .unwrap();
        assert_passes(spec.name(), &checks);
    }
}

use crate::losses;

fn assert_case_passes(case: &Case) {
    let report = check_model(case, &BuiltinFactory::new(&case.model).unwrap()).unwrap();
    // The zoo computes in f64 throughout: no tensor may look cast inside.
    assert!(
        report.lower_precision.is_empty(),
        "{} / {}: {:?} look computed below f64",
        report.family,
        report.loss,
        report.lower_precision
    );
    assert_eq!(report.precision, CheckPrecision::F64);
    for t in &report.tensors {
        assert!(
            t.passed,
            "{} / {}: {} failed (gradient {}, rel {:e}, abs {:e})",
            report.family, report.loss, t.name, t.has_gradient, t.max_rel_err, t.max_abs_err
        );
    }
}

#[test]
fn cnn_family_variants() {
    let base = Case::example("cnn").unwrap();
    assert_case_passes(&base);
    for act in [
        Activation::Gelu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::LeakyRelu,
    ] {
        let mut c = base.clone();
        let ModelSpec::Cnn(m) = &mut c.model else {
            unreachable!()
        };
        m.height = 9; // odd sizes exercise the pooling edge
        for b in &mut m.blocks {
            b.activation = act;
            b.pool = Pool::Max;
        }
        assert_case_passes(&c);
    }
}

#[test]
fn transformer_family_variants() {
    let base = Case::example("transformer").unwrap();
    assert_case_passes(&base);
    let variants: [fn(&mut TransformerSpec); 5] = [
        |t| t.norm = NormPlacement::Post,
        |t| t.norm = NormPlacement::None,
        |t| {
            t.causal = true;
            t.head = HeadKind::PerToken;
        },
        |t| {
            t.input = TokenOrContinuous::Continuous { features: 3 };
            t.attention_scale = AttentionScale::None;
        },
        |t| t.layers = 2,
    ];
    for v in variants {
        let mut c = base.clone();
        let ModelSpec::Transformer(t) = &mut c.model else {
            unreachable!()
        };
        v(t);
        assert_case_passes(&c);
    }
}

#[test]
fn rnn_family_variants() {
    for cell in [CellKind::Rnn, CellKind::Lstm, CellKind::Gru] {
        let mut c = Case::example("rnn").unwrap();
        let ModelSpec::Rnn(r) = &mut c.model else {
            unreachable!()
        };
        r.cell = cell;
        r.layers = 2;
        r.seq_len = 5;
        assert_case_passes(&c);
    }
}

#[test]
fn every_loss_through_a_family() {
    for loss in [
        LossSpec::Mse {
            root: false,
            eps: 0.0,
        },
        LossSpec::BceWithLogits,
        LossSpec::KlDiv { eps: 0.0 },
        LossSpec::PoissonNll {
            log_input: true,
            eps: 0.0,
        },
    ] {
        let mut c = Case::example("rnn").unwrap();
        c.loss = loss;
        assert_case_passes(&c);
    }
}

/// candle 0.11.1's ops that the zoo avoids, and proof that the checker catches
/// them. If one starts passing, candle fixed it and the zoo may use it.
#[test]
fn candle_ops_the_zoo_avoids_are_still_broken() {
    let x = randn(1, &[2, 6]);
    // candle's layer_norm has no f64 kernel: check in f32 that it yields no gradient.
    let f32v =
        |t: &Tensor| candle_core::Var::from_tensor(&t.to_dtype(DType::F32).unwrap()).unwrap();
    let (xv, wv, bv) = (f32v(&x), f32v(&randn(2, &[6])), f32v(&randn(3, &[6])));
    let y =
        candle_nn::ops::layer_norm(xv.as_tensor(), wv.as_tensor(), bv.as_tensor(), 1e-5).unwrap();
    let grads = (y * randn(5, &[2, 6]).to_dtype(DType::F32).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(
        grads.get(xv.as_tensor()).is_none() && grads.get(wv.as_tensor()).is_none(),
        "candle's layer_norm now has a gradient"
    );
    let sm = check_function(|xs| candle_nn::ops::softmax_last_dim(&xs[0]), &[x], 0).unwrap();
    assert!(
        sm.iter().any(|c| !c.passed),
        "candle's softmax_last_dim now passes"
    );
    // max_pool2d: the gradient of Σ pool(x) should sum to the 36 windows.
    let img = candle_core::Var::from_tensor(&randn(4, &[1, 1, 12, 12])).unwrap();
    let pooled = img.as_tensor().max_pool2d(2).unwrap().sum_all().unwrap();
    let g = pooled
        .backward()
        .unwrap()
        .get(img.as_tensor())
        .map(|g| g.sum_all().unwrap().to_scalar::<f64>().unwrap());
    assert_ne!(g, Some(36.0), "candle's max_pool2d gradient is now right");
    let mp = check_function(|xs| xs[0].max_pool2d(2), &[randn(4, &[1, 1, 12, 12])], 0).unwrap();
    assert!(
        mp.iter().any(|c| !c.passed),
        "the checker misses candle's max_pool2d bug"
    );
}

#[test]
fn decoder_family_variants() {
    let base = Case::example("decoder").unwrap();
    assert_case_passes(&base);
    for (heads, kv_heads, scale) in [
        (2, 2, AttentionScale::InvSqrtD),
        (4, 2, AttentionScale::None),
    ] {
        let mut c = base.clone();
        let ModelSpec::Decoder(d) = &mut c.model else {
            unreachable!()
        };
        (d.heads, d.kv_heads, d.attention_scale, d.layers) = (heads, kv_heads, scale, 2);
        assert_case_passes(&c);
    }
}

#[test]
fn encoder_family_variants() {
    let base = Case::example("encoder").unwrap();
    assert_case_passes(&base);
    let mut c = base.clone();
    let ModelSpec::Encoder(e) = &mut c.model else {
        unreachable!()
    };
    (e.mask, e.layers, e.norm_eps) = (MaskKind::NegInf, 2, 1e-5);
    assert_case_passes(&c);
}
