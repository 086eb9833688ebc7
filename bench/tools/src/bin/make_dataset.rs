//! Writes a synthetic dataset file for the `scan-data` benchmark:
//! `cargo run --release -p nanhunt-bench-tools --bin make_dataset -- OUT.safetensors SAMPLES FEATURES`.
//! Values are seeded normals (the harness's RNG), labels cycle through 10
//! classes, and every 100 000th sample gets a NaN, so the scan has work to
//! report.

use nanhunt::rng::Rng;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, samples, features] = args.as_slice() else {
        eprintln!("usage: make_dataset OUT.safetensors SAMPLES FEATURES");
        std::process::exit(2);
    };
    let (n, f): (usize, usize) = (samples.parse().unwrap(), features.parse().unwrap());
    let mut rng = Rng::new(0);
    let mut x = Vec::with_capacity(n * f * 4);
    for i in 0..n * f {
        let v = if i % (100_000 * f) == 7 {
            f32::NAN
        } else {
            rng.normal() as f32
        };
        x.extend_from_slice(&v.to_le_bytes());
    }
    let y: Vec<u8> = (0..n as i64).flat_map(|i| (i % 10).to_le_bytes()).collect();
    let tensors = vec![
        (
            "inputs",
            TensorView::new(Dtype::F32, vec![n, f], &x).unwrap(),
        ),
        ("labels", TensorView::new(Dtype::I64, vec![n], &y).unwrap()),
    ];
    safetensors::serialize_to_file(tensors, None, std::path::Path::new(out)).unwrap();
}
