//! The data's Gaussian noise: one `--size large` CNN batch (32 × 3×32×32
//! values) through `data::push_noisy` (the vectorized approximation that
//! settles each value, libm for the rest) and through the per-value libm
//! path it reproduces bit for bit. The ratio of the two lines is the
//! speed-up.

use criterion::{criterion_group, Criterion};
use nanhunt::data::{push_noisy, NoiseMap, NoiseScratch};
use nanhunt::rng::Rng;

fn noise(c: &mut Criterion) {
    let mut trng = Rng::new(1);
    let template: Vec<f64> = (0..3 * 32 * 32).map(|_| trng.normal()).collect();
    let map = NoiseMap {
        noise: 0.5,
        scale: 1.0,
        offset: 0.0,
    };
    let mut group = c.benchmark_group("data");
    group.bench_function("normal batch 32x3x32x32/fast", |b| {
        let (mut out, mut scratch) = (Vec::new(), NoiseScratch::default());
        b.iter(|| {
            let mut rng = Rng::new(7);
            out.clear();
            for _ in 0..32 {
                push_noisy(&mut rng, &template, map, &mut out, &mut scratch);
            }
            out.len()
        })
    });
    group.bench_function("normal batch 32x3x32x32/libm", |b| {
        let mut out = Vec::new();
        b.iter(|| {
            let mut rng = Rng::new(7);
            out.clear();
            for _ in 0..32 {
                out.extend(template.iter().map(|&t| map.apply(t, rng.normal())));
            }
            out.len()
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = noise
}
