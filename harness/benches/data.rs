//! The data's Gaussian noise: one `--size large` CNN batch (32 × 3×32×32
//! values) through `data::push_noisy` (the vectorized approximation that
//! settles each value, libm for the rest) and through the per-value libm
//! path it reproduces bit for bit. The ratio of the two lines is the
//! speed-up. And `scan-data`'s scan of a 64 MiB safetensors file from the
//! page cache (f32 read in place, and the same values stored as f64), on
//! one thread, in bytes of f32 per second: the scan without the process
//! around it.

use criterion::{criterion_group, Criterion, Throughput};
use nanhunt::data::scan::{scan_file, ScanOptions};
use nanhunt::data::{push_noisy, NoiseMap, NoiseScratch};
use nanhunt::rng::Rng;
use nanhunt::spec::FileSource;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

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

fn scan(c: &mut Criterion) {
    let (k, f) = (65_536, 256);
    let mut rng = Rng::new(3);
    let values: Vec<f32> = (0..k * f).map(|_| rng.normal() as f32).collect();
    let labels: Vec<u8> = (0..k as i64).flat_map(|i| (i % 10).to_le_bytes()).collect();
    let dir = std::env::temp_dir().join(format!("nanhunt-bench-scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let mut group = c.benchmark_group("scan");
    group.throughput(Throughput::Bytes((4 * k * f) as u64));
    for (name, dtype) in [("f32 in place", Dtype::F32), ("f64", Dtype::F64)] {
        let bytes: Vec<u8> = match dtype {
            Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => values
                .iter()
                .flat_map(|&v| f64::from(v).to_le_bytes())
                .collect(),
        };
        let path = dir.join(format!("{}.safetensors", name.replace(' ', "-")));
        let tensors = vec![
            (
                "inputs",
                TensorView::new(dtype, vec![k, f], &bytes).expect("inputs"),
            ),
            (
                "labels",
                TensorView::new(Dtype::I64, vec![k], &labels).expect("labels"),
            ),
        ];
        safetensors::serialize_to_file(tensors, None, &path).expect("the bench's file");
        let source = FileSource::new(&path);
        let mut opts = ScanOptions::default();
        opts.classes = Some(10);
        group.bench_function(format!("65536x256 {name}/1 thread"), |b| {
            b.iter(|| scan_file(&source, &opts).expect("a scan").samples)
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = noise, scan
}
