//! Criterion benches, one file per topic. Run: `cargo bench -p nanhunt`.

mod data;
mod kernels;
mod step;

criterion::criterion_main!(step::benches, kernels::benches, data::benches);
