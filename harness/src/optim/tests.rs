//! One and three update steps of every optimizer on a scalar parameter
//! p₀ = 1 with gradients 0.5, -0.25, 1.0. Expected values come from
//! `docs/reference/reference_values.py` (PyTorch's update rules written out
//! in plain Python f64).

use super::*;
use candle_core::{Device, Tensor, Var};

const GRADS: [f64; 3] = [0.5, -0.25, 1.0];
/// f64 arithmetic in a different order than the reference: a few ulps.
const STRICT: f64 = 1e-12;

fn trajectory(spec: OptimizerSpec) -> Vec<f64> {
    let p = Var::new(&[1f64], &Device::Cpu).unwrap();
    let mut opt = Optimizer::new(&spec, 1);
    GRADS
        .iter()
        .map(|&g| {
            let g = Tensor::new(&[g], &Device::Cpu).unwrap();
            opt.step(std::slice::from_ref(&p), &[g], spec.lr()).unwrap();
            p.as_tensor().to_vec1::<f64>().unwrap()[0]
        })
        .collect()
}

fn assert_close(got: Vec<f64>, want: [f64; 3]) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= STRICT, "{got:?} != {want:?}");
    }
}

#[test]
fn sgd_plain_momentum_and_nesterov() {
    // p -= lr·g
    assert_close(
        trajectory(OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }),
        [0.95, 0.975, 0.875],
    );
    // g += wd·p; buf = g (first step) then μ·buf + g; p -= lr·buf
    assert_close(
        trajectory(OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 0.01,
        }),
        [0.949, 0.927151, 0.8065597489999999],
    );
    // Nesterov: p -= lr·(g + μ·buf)
    assert_close(
        trajectory(OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.0,
        }),
        [0.905, 0.912, 0.7058],
    );
}

#[test]
fn adam_and_adamw() {
    // m, v EMAs; p -= (lr/bc1)·m / (sqrt(v)/sqrt(bc2) + eps), L2 decay in g
    assert_close(
        trajectory(OptimizerSpec::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }),
        [0.9000000019607843, 0.8712293476231743, 0.8046143342173858],
    );
    // AdamW: p *= 1 - lr·wd before the Adam step
    assert_close(
        trajectory(OptimizerSpec::Adamw {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        }),
        [0.890000002, 0.8544662986878463, 0.7801104766702113],
    );
}

#[test]
fn rmsprop_plain_and_momentum() {
    // v = α v + (1-α) g²; p -= lr·g/(sqrt(v) + eps)
    assert_close(
        trajectory(OptimizerSpec::Rmsprop {
            lr: 0.01,
            alpha: 0.99,
            eps: 1e-8,
            momentum: 0.0,
            weight_decay: 0.0,
        }),
        [0.900000019999996, 0.9449013374421751, 0.8574273783928595],
    );
    // buf = μ buf + g/(sqrt(v)+eps); p -= lr·buf
    assert_close(
        trajectory(OptimizerSpec::Rmsprop {
            lr: 0.01,
            alpha: 0.99,
            eps: 1e-8,
            momentum: 0.9,
            weight_decay: 0.01,
        }),
        [0.9000000196078394, 0.8529005249266659, 0.7230457967380477],
    );
}

#[test]
fn adam_with_zero_eps_turns_a_zero_gradient_into_nan() {
    let p = Var::new(&[1f32], &Device::Cpu).unwrap();
    let spec = OptimizerSpec::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 0.0,
        weight_decay: 0.0,
    };
    let mut opt = Optimizer::new(&spec, 1);
    opt.step(
        std::slice::from_ref(&p),
        &[Tensor::new(&[0f32], &Device::Cpu).unwrap()],
        0.1,
    )
    .unwrap();
    assert!(p.as_tensor().to_vec1::<f32>().unwrap()[0].is_nan()); // 0 / (0 + 0)
}

#[test]
fn state_is_exposed_by_name() {
    let p = Var::new(&[1f64], &Device::Cpu).unwrap();
    let spec = OptimizerSpec::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let mut opt = Optimizer::new(&spec, 1);
    opt.step(
        std::slice::from_ref(&p),
        &[Tensor::new(&[0.5f64], &Device::Cpu).unwrap()],
        0.1,
    )
    .unwrap();
    let names: Vec<String> = opt
        .state(&["w".into()])
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, vec!["m.w", "v.w"]);
}
