//! Each fused kernel against its reference composition of candle ops:
//! forward and backward of Σ w·f(inputs), at the sizes of the `--size
//! large` cases (batch 32), the fused kernel on every vector build the
//! CPU runs (`fused-avx512`, `fused-avx2`, `fused-baseline`: the x86-64
//! baseline build).
//! The ratio of a kernel's lines is its speed-up; run with
//! RAYON_NUM_THREADS=1 for the one-thread figures.

use candle_core::{Device, Result, Tensor, Var};
use criterion::{criterion_group, BenchmarkId, Criterion};
use nanhunt::kernels::{self, Kernels, PoolKind, Vectors};
use nanhunt::rng::Rng;

fn randn(seed: u64, shape: &[usize]) -> Tensor {
    let mut rng = Rng::keyed(seed, "bench.kernels", 0);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

type Op = fn(&[Tensor]) -> Result<Tensor>;

/// The fused kernels on each vector build this CPU runs (one line per
/// instruction set), and the reference composition.
fn runs() -> Vec<(String, Kernels, Vectors)> {
    let mut runs: Vec<(String, Kernels, Vectors)> = Vec::new();
    for v in [Vectors::Widest, Vectors::Avx2, Vectors::Baseline] {
        let label = format!("fused-{}", v.isa().name());
        if runs.iter().all(|(l, _, _)| *l != label) {
            runs.push((label, Kernels::Fused, v));
        }
    }
    runs.push(("reference".into(), Kernels::Reference, Vectors::Widest));
    runs
}

/// (name, op, input shapes, whether the first input is data: no gradient)
fn cases() -> Vec<(&'static str, Op, Vec<Vec<usize>>, bool)> {
    vec![
        (
            "linear 1024x64->64",
            |x| kernels::linear(&x[0], &x[1], &x[2]),
            vec![vec![1024, 64], vec![64, 64], vec![64]],
            false,
        ),
        (
            "conv2d 16->32 on 16x16",
            |x| kernels::conv2d(&x[0], &x[1], &x[2]),
            vec![vec![32, 16, 16, 16], vec![32, 16, 3, 3], vec![32]],
            false,
        ),
        (
            "conv2d 3->16 on 32x32 data",
            |x| kernels::conv2d(&x[0], &x[1], &x[2]),
            vec![vec![32, 3, 32, 32], vec![16, 3, 3, 3], vec![16]],
            true,
        ),
        (
            "relu 32x16x32x32",
            |x| kernels::relu(&x[0]),
            vec![vec![32, 16, 32, 32]],
            false,
        ),
        (
            "gelu 32x32x128",
            |x| kernels::gelu(&x[0]),
            vec![vec![32, 32, 128]],
            false,
        ),
        (
            "attention scores+context 32x32x64, 4 heads",
            |x| {
                let p = kernels::softmax_last_dim(&kernels::attention_scores(
                    &x[0],
                    &x[1],
                    4,
                    Some(0.25),
                )?)?;
                kernels::attention_context(&p, &x[2], 4)
            },
            vec![vec![32, 32, 64], vec![32, 32, 64], vec![32, 32, 64]],
            false,
        ),
        (
            "max_pool 32x16x32x32",
            |x| kernels::pool2x2(&x[0], PoolKind::Max),
            vec![vec![32, 16, 32, 32]],
            false,
        ),
        (
            "layer_norm 32x32x64",
            |x| kernels::layer_norm(&x[0], &x[1], &x[2], 1e-5),
            vec![vec![32, 32, 64], vec![64], vec![64]],
            false,
        ),
        (
            "rms_norm 32x32x64",
            |x| kernels::rms_norm(&x[0], &x[1], 1e-5),
            vec![vec![32, 32, 64], vec![64]],
            false,
        ),
        (
            "swiglu 32x32x128",
            |x| kernels::swiglu(&x[0], &x[1]),
            vec![vec![32, 32, 128], vec![32, 32, 128]],
            false,
        ),
        (
            "rope 32x32x64, 4 heads",
            |x| kernels::rope_heads(&x[0], 4, &x[1], &x[2]),
            vec![vec![32, 32, 64], vec![32, 8], vec![32, 8]],
            false,
        ),
        (
            "softmax 32x4x32x32",
            |x| kernels::softmax_last_dim(&x[0]),
            vec![vec![32, 4, 32, 32]],
            false,
        ),
        (
            "causal softmax 32x4x32x32",
            |x| kernels::causal_softmax(&x[0]),
            vec![vec![32, 4, 32, 32]],
            false,
        ),
        (
            "cross-entropy 1024x64",
            |x| kernels::cross_entropy(&x[0], &x[1]),
            vec![vec![1024, 64], vec![1024, 64]],
            false,
        ),
        (
            "lstm cell 32x64",
            |x| {
                let act = kernels::lstm_activate(&x[0])?;
                kernels::lstm_h(&act, &kernels::lstm_c(&act, &x[1])?)
            },
            vec![vec![32, 256], vec![32, 64]],
            false,
        ),
        (
            "lstm layer 32x32 steps, 16->64, data input",
            |x| kernels::lstm_layer(&x[0], &x[1], &x[2], &x[3], &x[4]),
            vec![
                vec![32, 32, 16],
                vec![256, 16],
                vec![256],
                vec![256, 64],
                vec![256],
            ],
            true,
        ),
        (
            "gru layer 32x32 steps, 16->64, data input",
            |x| kernels::gru_layer(&x[0], &x[1], &x[2], &x[3], &x[4]),
            vec![
                vec![32, 32, 16],
                vec![192, 16],
                vec![192],
                vec![192, 64],
                vec![192],
            ],
            true,
        ),
        (
            "tanh rnn layer 32x32 steps, 16->64, data input",
            |x| kernels::tanh_rnn_layer(&x[0], &x[1], &x[2], &x[3], &x[4]),
            vec![
                vec![32, 32, 16],
                vec![64, 16],
                vec![64],
                vec![64, 64],
                vec![64],
            ],
            true,
        ),
        (
            "gru cell 32x64",
            |x| {
                let n = kernels::gru_n(&x[0], &x[1], &x[2])?;
                kernels::gru_h(&x[0], &n, &x[3])
            },
            vec![vec![32, 128], vec![32, 192], vec![32, 192], vec![32, 64]],
            false,
        ),
    ]
}

fn forward_backward(c: &mut Criterion) {
    nanhunt::device::retain_freed_memory(); // as the nanhunt binary does
    let mut group = c.benchmark_group("kernel");
    for (name, op, shapes, data_first) in cases() {
        let inputs: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let t = randn(i as u64, s);
                if i == 0 && data_first {
                    t
                } else {
                    Var::from_tensor(&t).unwrap().as_tensor().clone()
                }
            })
            .collect();
        let weights = op(&inputs).map(|y| randn(99, y.dims())).unwrap();
        // The fused kernel on each vector build, and the reference.
        for (label, k, v) in runs() {
            group.bench_function(BenchmarkId::new(name, label), |b| {
                b.iter(|| {
                    kernels::with_vectors(v, || {
                        kernels::with_kernels(k, || {
                            let y = op(&inputs).unwrap();
                            (y * &weights)
                                .unwrap()
                                .sum_all()
                                .unwrap()
                                .backward()
                                .unwrap()
                        })
                    })
                })
            });
        }
    }
    group.finish();
}

/// One optimizer step (Adam, and SGD with momentum) over a family's
/// parameter list: many small tensors (the small sizes) and a few large
/// ones, the fused pass on each vector build against the op chain.
fn optimizer_step(c: &mut Criterion) {
    nanhunt::device::retain_freed_memory();
    let mut group = c.benchmark_group("optimizer");
    let lists: [(&str, Vec<Vec<usize>>); 2] = [
        (
            "24 tensors of 8..64",
            (0..24).map(|i| vec![8 * (1 + i % 8)]).collect(),
        ),
        (
            "4 tensors of 64x1024",
            (0..4).map(|_| vec![64, 1024]).collect(),
        ),
    ];
    let adam = nanhunt::spec::OptimizerSpec::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let sgd = nanhunt::spec::OptimizerSpec::Sgd {
        lr: 1e-2,
        momentum: 0.9,
        nesterov: false,
        weight_decay: 1e-4,
    };
    for (list, shapes) in &lists {
        let params: Vec<Var> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| Var::from_tensor(&randn(i as u64, s)).unwrap())
            .collect();
        let grads: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| randn(100 + i as u64, s))
            .map(|g| (g * 1e-3).unwrap())
            .collect();
        for (rule, spec) in [("adam", &adam), ("sgd momentum", &sgd)] {
            for (label, k, v) in runs() {
                let mut opt = nanhunt::optim::Optimizer::new(spec, params.len());
                let name = format!("{rule}, {list}");
                group.bench_function(BenchmarkId::new(name, label), |b| {
                    b.iter(|| {
                        kernels::with_vectors(v, || {
                            kernels::with_kernels(k, || opt.step(&params, &grads, spec.lr()))
                        })
                        .unwrap()
                    })
                });
            }
        }
    }
    group.finish();
}

/// The probe's scans of a step's tensors on each vector build: Σx² and
/// max |x| over values read from the host, and the first non-finite
/// tensor of a list (the guard's checks of the batch and the loss).
fn probe_scan(c: &mut Criterion) {
    let mut group = c.benchmark_group("probe");
    let big = randn(7, &[64, 1024]);
    let values: Vec<f32> = big.flatten_all().unwrap().to_vec1().unwrap();
    let list: Vec<Tensor> = (0..24)
        .map(|i| randn(i, &[8 * (1 + i as usize % 8)]))
        .collect();
    let refs: Vec<&Tensor> = list.iter().collect();
    for (label, _, v) in runs().into_iter().filter(|r| r.1 == Kernels::Fused) {
        group.bench_function(BenchmarkId::new("scan 64x1024 f32", &label), |b| {
            b.iter(|| kernels::with_vectors(v, || nanhunt::probe::scan_host(&values)))
        });
        group.bench_function(
            BenchmarkId::new("first non-finite of 24 tensors", &label),
            |b| {
                b.iter(|| {
                    kernels::with_vectors(v, || nanhunt::probe::first_non_finite(&refs).unwrap())
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = forward_backward, optimizer_step, probe_scan
}
