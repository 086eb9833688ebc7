//! The nanhunt side of the side-by-side benchmark (`bench/side_by_side.sh`):
//! the `--size large` case of each family (f32, batch 32, Adam 1e-3,
//! cross-entropy): median milliseconds per training step with the probe on
//! (the real workload: data generation, probe and snapshot included), the
//! probe's overhead (probe on and off interleaved step by step), and the
//! fuzz workload (fresh 5-step CNN runs). One JSON object per line. Run
//! with RAYON_NUM_THREADS=1 for one compute thread.
//!
//! `cargo run --release -p nanhunt --example side_by_side -- [STEPS] [FAMILY|fuzz]`

use nanhunt::lrtable::optimizer_named;
use nanhunt::models::BuiltinFactory;
use nanhunt::runner::{RunOptions, Session};
use nanhunt::spec::{Case, OptimizerSpec, Size};
use std::time::Instant;

fn case(family: &str, seed: u64) -> Case {
    let mut case = Case::example_sized(family, Size::Large).expect("a built-in family");
    case.optimizer = optimizer_named("adam").expect("adam");
    case.optimizer.set_lr(1e-3);
    assert!(matches!(case.optimizer, OptimizerSpec::Adam { .. }));
    case.seed = seed;
    case.steps = 1_000;
    case
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds per step of one session with the probe on (the workload).
fn step_time(case: &Case, steps: usize) -> anyhow::Result<f64> {
    let factory = BuiltinFactory::new(&case.model).expect("built-in");
    let mut session = Session::new(case, &factory, &RunOptions::default())?;
    let mut times = Vec::with_capacity(steps);
    for step in 0..steps + 3 {
        let t0 = Instant::now();
        if let Some(f) = session.step(step)? {
            anyhow::bail!("{} became unstable: {}", case.family(), f.signature);
        }
        if step >= 3 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(median(times))
}

/// Median seconds per step with the probe on and off, over `steps` steps
/// of each after 3 warm-up steps, interleaved so that both see the same
/// machine state.
fn step_times(case: &Case, steps: usize) -> anyhow::Result<(f64, f64)> {
    let factory = BuiltinFactory::new(&case.model).expect("built-in");
    let session = |probe| {
        let opts = RunOptions::default().with_probe(probe);
        Session::new(case, &factory, &opts)
    };
    let (mut on, mut off) = (session(true)?, session(false)?);
    let (mut t_on, mut t_off) = (Vec::new(), Vec::new());
    for step in 0..steps + 3 {
        for (s, times) in [(&mut on, &mut t_on), (&mut off, &mut t_off)] {
            let t0 = Instant::now();
            if let Some(f) = s.step(step)? {
                anyhow::bail!("{} became unstable: {}", case.family(), f.signature);
            }
            if step >= 3 {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
    }
    Ok((median(t_on), median(t_off)))
}

fn main() -> anyhow::Result<()> {
    nanhunt::device::retain_freed_memory(); // as the nanhunt binary does
    let steps: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(30);
    // An optional family name runs that family's step alone (for profiling).
    let only = std::env::args().nth(2);
    for family in ["cnn", "transformer", "rnn", "decoder", "encoder"] {
        if only.as_deref().is_some_and(|f| f != family) {
            continue;
        }
        let c = case(family, 0);
        let step = step_time(&c, steps)?;
        let (on, off) = step_times(&c, steps)?;
        println!(
            "{{\"framework\": \"nanhunt\", \"family\": \"{family}\", \"ms_per_step\": {}, \"probe_overhead\": {}}}",
            step * 1e3,
            on / off - 1.0
        );
    }
    if only.as_deref().is_some_and(|f| f != "fuzz") {
        return Ok(());
    }
    // Fuzz workload: a fresh session (model creation included), 5 steps, repeated.
    let started = Instant::now();
    let mut runs = 0u64;
    while started.elapsed().as_secs_f64() < 5.0 {
        let mut c = case("cnn", runs);
        c.steps = 5;
        let factory = BuiltinFactory::new(&c.model).expect("built-in");
        let mut session = Session::new(&c, &factory, &RunOptions::default())?;
        for step in 0..5 {
            session.step(step)?;
        }
        runs += 1;
    }
    println!(
        "{{\"framework\": \"nanhunt\", \"family\": \"fuzz_cnn_5_steps\", \"steps_per_s\": {}}}",
        5.0 * runs as f64 / started.elapsed().as_secs_f64()
    );
    Ok(())
}
