//! One of the guard bench's two small loops alone, guarded (`on`) or
//! plain (`off`): the guard's own work counted as the difference of two
//! instruction counts, which this machine's timing noise cannot resolve.
//!
//! ```text
//! RAYON_NUM_THREADS=1 valgrind --tool=callgrind target/release/guard_loop_alone rnn on 2000
//! RAYON_NUM_THREADS=1 valgrind --tool=callgrind target/release/guard_loop_alone rnn off 2000
//! ```
//! Arguments: FAMILY (default rnn), on|off (default on), STEPS (default 20000).
#[path = "../../../../harness/benches/shared/guard_loop.rs"]
mod guard_loop;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use nanhunt::data::Generator;
use nanhunt::guard::{Batch, Guard, GuardOptions};
use nanhunt::models::{BuiltinFactory, ModelFactory};
use nanhunt::spec::Size;
use nanhunt::Case;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let family = args.get(1).cloned().unwrap_or("rnn".into());
    let guarded = args.get(2).map(|s| s == "on").unwrap_or(true);
    let steps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20000);
    nanhunt::device::retain_freed_memory();
    let case = Case::example_sized(&family, Size::Small).unwrap();
    let generator = Generator::new(&case);
    let dev = Device::Cpu;
    let batches: Vec<Batch> = (0..8)
        .map(|s| guard_loop::to_batch(&generator.batch(s, case.batch_size)))
        .collect();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let model = BuiltinFactory::new(&case.model).unwrap().build(vb).unwrap();
    let mut guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
    println!(
        "{family}: {} variables, {} values",
        guard.vars().len(),
        guard.vars().iter().map(|v| v.elem_count()).sum::<usize>()
    );
    let mut opt = guard.optimizer(case.optimizer.clone()).unwrap();
    let loss = case.loss.clone();
    let start = Instant::now();
    for step in 0..steps {
        let b = &batches[step % 8];
        let loss_of = |b: &Batch| guard_loop::loss_of(&*model, &loss, b);
        if guarded {
            guard.step(step, b, &mut opt, loss_of).unwrap();
        } else {
            guard_loop::plain_step(&mut opt, loss_of(b).unwrap());
        }
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / steps as f64;
    let what = if guarded { "guarded" } else { "plain" };
    println!("{what}: {us:.2} µs a step");
}
