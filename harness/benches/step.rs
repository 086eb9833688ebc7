//! One training step of each family's default case, with the per-step probe
//! on and off; their ratio is the probe's overhead.

use criterion::{criterion_group, BenchmarkId, Criterion};
use nanhunt::models::BuiltinFactory;
use nanhunt::runner::Session;
use nanhunt::spec::FAMILIES;
use nanhunt::{Case, RunOptions};

fn training_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("step");
    for family in FAMILIES {
        let mut case = Case::example(family).unwrap();
        case.steps = 1_000_000; // never reach the end inside the bench
        let factory = BuiltinFactory::new(&case.model).unwrap();
        for probe in [true, false] {
            let opts = RunOptions {
                probe,
                limits: nanhunt::Limits {
                    max_steps: case.steps,
                    ..Default::default()
                },
                ..Default::default()
            };
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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(4));
    targets = training_step
}
