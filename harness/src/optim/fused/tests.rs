//! The fused update against the op chain, bit for bit: every rule and
//! option, f32 and f64, three steps (the first has no state), over values
//! that include ±0, subnormals, huge values, infinities and NaN.

use crate::kernels::{with_kernels, with_vectors, Kernels, Vectors};
use crate::optim::Optimizer;
use crate::spec::OptimizerSpec;
use candle_core::{DType, Device, Tensor, Var};

fn specs() -> Vec<OptimizerSpec> {
    let sgd = |momentum, nesterov, weight_decay| OptimizerSpec::Sgd {
        lr: 0.1,
        momentum,
        nesterov,
        weight_decay,
    };
    let adam = |weight_decay| OptimizerSpec::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay,
    };
    let adamw = |weight_decay| OptimizerSpec::Adamw {
        lr: 1e-2,
        beta1: 0.8,
        beta2: 0.99,
        eps: 1e-6,
        weight_decay,
    };
    let rmsprop = |momentum, weight_decay| OptimizerSpec::Rmsprop {
        lr: 1e-2,
        alpha: 0.99,
        eps: 1e-8,
        momentum,
        weight_decay,
    };
    vec![
        sgd(0.0, false, 0.0),
        sgd(0.9, false, 0.01),
        sgd(0.9, true, 0.0),
        sgd(f64::NAN, false, 0.0),
        adam(0.0),
        adam(0.01),
        adamw(0.0),
        adamw(0.1),
        rmsprop(0.0, 0.0),
        rmsprop(0.9, 0.01),
    ]
}

/// Ordinary values with the pathological ones mixed in.
fn values(seed: u64, n: usize) -> Vec<f64> {
    let special = [
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-40,
        -1e-310,
        3e38,
        -1e30,
        1e-30,
    ];
    let mut rng = crate::rng::Rng::new(seed);
    (0..n)
        .map(|i| match i % 7 {
            0 => special[(i / 7) % special.len()],
            _ => rng.normal(),
        })
        .collect()
}

/// The parameters and every state tensor after each of three steps.
fn trajectory(spec: &OptimizerSpec, dtype: DType, kernels: Kernels) -> Vec<Vec<f64>> {
    let dev = Device::Cpu;
    let shapes = [(3usize, 5usize), (1, 70), (9, 8)];
    let params: Vec<Var> = shapes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let t = Tensor::from_vec(values(i as u64, s.0 * s.1), s, &dev).unwrap();
            Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
        })
        .collect();
    let mut opt = Optimizer::new(spec, params.len());
    let mut seen = Vec::new();
    for step in 0..3u64 {
        let grads: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let v = values(100 + 10 * step + i as u64, s.0 * s.1);
                Tensor::from_vec(v, s, &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            })
            .collect();
        with_kernels(kernels, || opt.step(&params, &grads, spec.lr())).unwrap();
        let read = |t: &Tensor| {
            t.flatten_all()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        seen.extend(params.iter().map(|p| read(p.as_tensor())));
        seen.extend(opt.state_tensors().map(|(_, _, t)| read(t)));
    }
    seen
}

#[test]
fn the_fused_update_gives_the_op_chains_bits() {
    for spec in specs() {
        for dtype in [DType::F32, DType::F64] {
            let fused = trajectory(&spec, dtype, Kernels::Fused);
            // The narrower builds' passes give the widest pass's bits.
            let bits = |t: &[Vec<f64>]| -> Vec<Vec<u64>> {
                t.iter()
                    .map(|v| v.iter().map(|x| x.to_bits()).collect())
                    .collect()
            };
            for narrower in [Vectors::Avx2, Vectors::Baseline] {
                let narrow = with_vectors(narrower, || trajectory(&spec, dtype, Kernels::Fused));
                assert_eq!(
                    bits(&fused),
                    bits(&narrow),
                    "{spec:?} {dtype:?} {narrower:?}"
                );
            }
            let chain = trajectory(&spec, dtype, Kernels::Reference);
            assert_eq!(fused.len(), chain.len(), "{spec:?} {dtype:?}");
            for (k, (a, b)) in fused.iter().zip(&chain).enumerate() {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    let same = x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
                    assert!(same, "{spec:?} {dtype:?} tensor {k} [{i}]: {x:e} != {y:e}");
                }
            }
        }
    }
}

#[test]
fn a_strided_gradient_takes_the_op_chain_with_the_same_result() {
    let dev = Device::Cpu;
    let spec = &specs()[4];
    let run = |transposed: bool| {
        let p = Var::from_tensor(&Tensor::from_vec(values(1, 12), (3, 4), &dev).unwrap()).unwrap();
        let g = Tensor::from_vec(values(2, 12), (4, 3), &dev)
            .unwrap()
            .t()
            .unwrap();
        let g = if transposed {
            g
        } else {
            g.contiguous().unwrap()
        };
        let mut opt = Optimizer::new(spec, 1);
        opt.step(std::slice::from_ref(&p), &[g], spec.lr()).unwrap();
        p.as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };
    let (a, b) = (run(true), run(false));
    assert!(a
        .iter()
        .zip(&b)
        .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())));
}

#[test]
fn the_fused_pass_scans_what_a_scan_of_its_tensors_gives() {
    // Each vector build's pass: its sums in the probe's lanes and order.
    for build in [Vectors::Widest, Vectors::Avx2, Vectors::Baseline] {
        with_vectors(build, scans_of_each_rule);
    }
}

fn scans_of_each_rule() {
    let dev = Device::Cpu;
    // Whole vectors (of eight and of sixteen), tails, and a tail alone.
    let sizes = [40usize, 43, 5];
    // Pathological values (the counting scans), and ordinary ones only
    // (the sums of the rule's own loop).
    let cases = specs()
        .into_iter()
        .flat_map(|s| [(s.clone(), false), (s, true)]);
    for (spec, ordinary) in cases {
        let values = |seed, n| {
            let v = values(seed, n).into_iter();
            let keep = |x: f64| !ordinary || (x.is_finite() && x.abs() < 1e3);
            v.map(|x| if keep(x) { x } else { 0.25 })
                .collect::<Vec<f64>>()
        };
        for dtype in [DType::F32, DType::F64] {
            let params: Vec<Var> = (0..3u64)
                .map(|i| {
                    let t = Tensor::from_vec(values(i, sizes[i as usize]), sizes[i as usize], &dev)
                        .unwrap();
                    Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
                })
                .collect();
            let mut opt = Optimizer::new(&spec, params.len());
            // The runner's form (`step_checked`: what it writes only), on
            // a twin of the same values.
            let twin: Vec<Var> = params
                .iter()
                .map(|p| Var::from_tensor(&p.as_tensor().copy().unwrap()).unwrap())
                .collect();
            let mut twin_opt = Optimizer::new(&spec, twin.len());
            for step in 0..3u64 {
                // Finite gradients on the first parameter, so that the
                // first bad state is not always the first one.
                let grads: Vec<Tensor> = (0..3u64)
                    .map(|i| {
                        let v: Vec<f64> = values(50 + 10 * step + i, sizes[i as usize])
                            .into_iter()
                            .map(|x| if i == 0 && !x.is_finite() { 0.5 } else { x })
                            .collect();
                        Tensor::from_vec(v, sizes[i as usize], &dev)
                            .unwrap()
                            .to_dtype(dtype)
                            .unwrap()
                    })
                    .collect();
                // The guard's form, the gradients scanned too (the
                // runner's, `step_checked`, scans what it writes only).
                let (new, got) = opt.update_checked(&params, &grads, spec.lr()).unwrap();
                let got = got.expect("every parameter takes the fused pass");
                for (p, new) in params.iter().zip(&new) {
                    p.set(new).unwrap();
                }
                let refs: Vec<&Tensor> = params.iter().map(|p| p.as_tensor()).collect();
                let grad_refs: Vec<&Tensor> = grads.iter().collect();
                if ordinary {
                    let all = grad_refs.iter().chain(&refs).copied().collect::<Vec<_>>();
                    assert!(crate::probe::first_non_finite(&all).unwrap().is_none());
                }
                // The gradients (with their NaNs and infinities) as read,
                // the parameters as written.
                for (got, of) in [(&got.grads, &grad_refs), (&got.params, &refs)] {
                    let want = crate::probe::scan_all(of).unwrap();
                    assert_eq!(got.len(), want.len());
                    for (a, b) in got.iter().zip(&want) {
                        assert_eq!(a.sum_sq.to_bits(), b.sum_sq.to_bits(), "{spec:?} {dtype:?}");
                        // Measured only where a value is not finite.
                        match b.is_finite() {
                            true => assert!(a.max_abs.is_nan(), "{spec:?} {dtype:?}"),
                            false => assert_eq!(
                                a.max_abs.to_bits(),
                                b.max_abs.to_bits(),
                                "{spec:?} {dtype:?}"
                            ),
                        }
                        assert_eq!((a.nan, a.inf), (b.nan, b.inf), "{spec:?} {dtype:?}");
                    }
                }
                let state: Vec<(usize, &str, &Tensor)> = opt.state_tensors().collect();
                let tensors: Vec<&Tensor> = state.iter().map(|s| s.2).collect();
                let first = crate::probe::first_non_finite(&tensors).unwrap();
                assert_eq!(got.bad_state, first, "{spec:?} {dtype:?} step {step}");
                let seen = twin_opt.step_checked(&twin, &grads, spec.lr()).unwrap();
                let seen = seen.expect("every parameter takes the fused pass");
                assert!(seen.grads.is_empty(), "{spec:?} {dtype:?}");
                let bits = |s: &[crate::probe::TensorScan]| -> Vec<_> {
                    let b = |x: f64| x.to_bits();
                    s.iter()
                        .map(|s| (b(s.sum_sq), b(s.max_abs), s.nan, s.inf))
                        .collect()
                };
                assert_eq!(bits(&seen.params), bits(&got.params), "{spec:?} {dtype:?}");
                assert_eq!(
                    seen.bad_state, got.bad_state,
                    "{spec:?} {dtype:?} step {step}"
                );
            }
        }
    }
}

#[test]
fn the_op_chains_state_keeps_no_graph() {
    // Weight decay runs ops on the tracked parameter: a state that kept
    // their graph would hold every step's tensors.
    let dev = Device::Cpu;
    for spec in specs() {
        let p = Var::from_tensor(&Tensor::from_vec(values(3, 6), 6, &dev).unwrap()).unwrap();
        let g = Tensor::from_vec(values(4, 6), 6, &dev).unwrap();
        let mut opt = Optimizer::new(&spec, 1);
        let new = with_kernels(Kernels::Reference, || {
            opt.step(
                std::slice::from_ref(&p),
                std::slice::from_ref(&g),
                spec.lr(),
            )
            .unwrap();
            opt.update(
                std::slice::from_ref(&p),
                std::slice::from_ref(&g),
                spec.lr(),
            )
        })
        .unwrap();
        assert!(!new[0].track_op(), "{spec:?}");
        for (_, kind, t) in opt.state_tensors() {
            assert!(!t.track_op(), "{spec:?} {kind}");
        }
    }
}

/// Every value of a list of tensors as bits (NaNs compared by bits too).
fn bits_of<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Vec<Vec<u64>> {
    tensors
        .into_iter()
        .map(|t| {
            t.to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn a_staged_update_gives_the_bits_of_one_in_place_and_leaves_its_source_as_it_was() {
    let dev = Device::Cpu;
    // A staging optimizer that last held another rule's state (momentum):
    // what the new rule does not write must not survive into its state.
    let other = OptimizerSpec::Sgd {
        lr: 0.1,
        momentum: 0.9,
        nesterov: false,
        weight_decay: 0.0,
    };
    for kernels in [Kernels::Fused, Kernels::Reference] {
        for spec in specs() {
            let var = |seed| {
                Var::from_tensor(&Tensor::from_vec(values(seed, 24), (3, 8), &dev).unwrap())
                    .unwrap()
            };
            let (a, b) = (vec![var(1), var(2)], vec![var(1), var(2)]);
            let mut in_place = Optimizer::new(&spec, 2);
            let mut current = Optimizer::new(&spec, 2);
            let mut staging = Optimizer::new(&other, 2);
            let grads: Vec<Tensor> = (0..2)
                .map(|i| Tensor::from_vec(values(7 + i, 24), (3, 8), &dev).unwrap())
                .collect();
            let scratch = vec![var(3), var(4)];
            with_kernels(kernels, || staging.step(&scratch, &grads, 0.1)).unwrap();
            for step in 0..3u64 {
                let grads: Vec<Tensor> = (0..2)
                    .map(|i| Tensor::from_vec(values(20 + 3 * step + i, 24), (3, 8), &dev).unwrap())
                    .collect();
                let source = bits_of(current.state_tensors().map(|s| s.2));
                let (want, _) =
                    with_kernels(kernels, || in_place.update_checked(&a, &grads, spec.lr()))
                        .unwrap();
                let (got, _) = with_kernels(kernels, || {
                    staging.update_checked_from(&current, (&b, &grads), spec.lr(), None)
                })
                .unwrap();
                let what = format!("{spec:?} {kernels:?} step {step}");
                assert_eq!(bits_of(&got), bits_of(&want), "{what}");
                assert_eq!(
                    source,
                    bits_of(current.state_tensors().map(|s| s.2)),
                    "{what}"
                );
                let kinds = |o: &Optimizer| -> Vec<(usize, &str)> {
                    o.state_tensors().map(|(i, k, _)| (i, k)).collect()
                };
                assert_eq!(kinds(&staging), kinds(&in_place), "{what}");
                assert_eq!(
                    bits_of(staging.state_tensors().map(|s| s.2)),
                    bits_of(in_place.state_tensors().map(|s| s.2)),
                    "{what}"
                );
                assert_eq!(staging.steps(), in_place.steps(), "{what}");
                std::mem::swap(&mut current, &mut staging);
                for (p, new) in a.iter().zip(&want).chain(b.iter().zip(&got)) {
                    p.set(new).unwrap();
                }
            }
        }
    }
}
