//! Criterion benches, one file per topic. Run: `cargo bench -p nanhunt`.

mod kernels;
mod step;

criterion::criterion_main!(step::benches, kernels::benches);
