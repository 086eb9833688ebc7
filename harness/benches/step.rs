//! One training step of each family's default case, with the per-step probe
//! on and off (their ratio is the probe's overhead), and of each family's
//! large case on the fused kernels and on the reference compositions.

use criterion::{criterion_group, BenchmarkId, Criterion};
use nanhunt::kernels::{with_kernels, Kernels};
use nanhunt::models::BuiltinFactory;
use nanhunt::runner::Session;
use nanhunt::spec::FAMILIES;
use nanhunt::{Case, RunOptions};

fn training_step(c: &mut Criterion) {
    nanhunt::device::retain_freed_memory(); // as the nanhunt binary does
    let mut group = c.benchmark_group("step");
    for family in FAMILIES {
        let mut case = Case::example(family).unwrap();
        case.steps = 1_000_000; // never reach the end inside the bench
        let factory = BuiltinFactory::new(&case.model).unwrap();
        for probe in [true, false] {
            let opts = RunOptions::default()
                .with_probe(probe)
                .with_limits(nanhunt::Limits::default().max_steps(case.steps));
            let mut session = Session::new(&case, &factory, &opts).unwrap();
            let mut step = 0;
            let label = if probe { "probe_on" } else { "probe_off" };
            group.bench_function(BenchmarkId::new(family, label), |b| {
                b.iter(|| {
                    let found = session.step(step).unwrap();
                    assert!(found.is_none(), "the default case must stay stable");
                    step += 1;
                })
            });
        }
    }
    group.finish();
}

/// One training step of each family's `--size large` case (batch 32, the
/// side-by-side benchmark's models) on the fused kernels and on the
/// reference compositions: the kernels' effect on a whole step.
fn training_step_large(c: &mut Criterion) {
    nanhunt::device::retain_freed_memory(); // as the nanhunt binary does
    let mut group = c.benchmark_group("step_large");
    for family in FAMILIES {
        let mut case = Case::example_sized(family, nanhunt::spec::Size::Large).unwrap();
        case.steps = 1_000_000;
        let factory = BuiltinFactory::new(&case.model).unwrap();
        for kernels in [Kernels::Fused, Kernels::Reference] {
            let opts =
                RunOptions::default().with_limits(nanhunt::Limits::default().max_steps(case.steps));
            let mut session = Session::new(&case, &factory, &opts).unwrap();
            let mut step = 0;
            let label = if kernels == Kernels::Fused {
                "fused"
            } else {
                "reference"
            };
            group.bench_function(BenchmarkId::new(family, label), |b| {
                b.iter(|| {
                    with_kernels(kernels, || session.step(step).unwrap());
                    step += 1;
                })
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(4));
    targets = training_step, training_step_large
}
