//! Batches from a dataset file against the synthetic generator, for the same
//! shapes: each family's default case, its batches drawn once from the
//! generator into an in-memory dataset (4096 samples, the form a loaded
//! file takes), then drawn again through the sampler (shuffled epochs).
//! Run: `cargo bench -p nanhunt --bench data_sources`.

use criterion::{criterion_group, criterion_main, Criterion};
use nanhunt::data::{
    DataSource, Dataset, Generator, HostInput, MemoryDataset, SampleShape, Sampled,
};
use nanhunt::spec::{Sampling, FAMILIES};
use nanhunt::Case;
use std::hint::black_box;
use std::sync::Arc;

const SAMPLES: usize = 4096;

/// The generator's samples of `case`, as a dataset.
fn dataset_of(case: &Case, generator: &Generator) -> Arc<dyn Dataset> {
    let (mut values, mut labels) = (Vec::new(), Vec::new());
    let per_step = case.batch_size;
    for step in 0..SAMPLES / per_step {
        let b = generator.batch(step, per_step);
        match b.input {
            HostInput::Real { values: v, .. } => values.extend(v),
            HostInput::Tokens { ids, .. } => values.extend(ids.iter().map(|&i| i as f32)),
        }
        let per = b.labels.len() / per_step;
        labels.extend(b.labels.chunks(per).map(|l| l[0]));
    }
    let input = case.model.input();
    let shape = SampleShape {
        dims: input.dims(),
        integer: input.is_tokens(),
        labels: 1,
        targets: 0,
    };
    Arc::new(MemoryDataset::new("bench".into(), shape, values, labels, Vec::new()).unwrap())
}

fn batches(c: &mut Criterion) {
    let mut group = c.benchmark_group("data_batch");
    for family in FAMILIES {
        let case = Case::example(family).unwrap();
        let generator = Generator::new(&case);
        let file =
            Sampled::new(dataset_of(&case, &generator), &Sampling::default(), &case).unwrap();
        let mut step = 0;
        group.bench_function(format!("synthetic/{family}"), |b| {
            b.iter(|| {
                step += 1;
                black_box(DataSource::batch(&generator, step, case.batch_size).unwrap())
            })
        });
        let mut step = 0;
        group.bench_function(format!("file/{family}"), |b| {
            b.iter(|| {
                step += 1;
                black_box(file.batch(step, case.batch_size).unwrap())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, batches);
criterion_main!(benches);
