//! The nanhunt side of the side-by-side benchmark (`bench/side_by_side.sh`):
//! the `--size large` case of each family (f32, batch 32, Adam 1e-3,
//! cross-entropy): median milliseconds per training step with the probe on
//! (the real workload: data generation, probe and snapshot included), the
//! probe's overhead (the median ratio of interleaved steps with the probe
//! on and off), and the
//! fuzz workload (fresh 5-step CNN runs). One JSON object per line. Run
//! with RAYON_NUM_THREADS=1 for one compute thread.
//!
//! `cargo run --release -p nanhunt-bench-tools --bin side_by_side -- [STEPS] [FAMILY|fuzz]`
//!
//! `side_by_side serve FAMILY` keeps one session (probe on) and times steps
//! on request, for `bench/paired.py`, which alternates it with PyTorch in
//! short chunks: each line read is a step count, each line written the
//! seconds of those steps (`{"times": [...]}`), after a `{"ready": true}`.

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

/// The seconds of each of `session`'s steps in `steps`; an error where
/// one became unstable.
fn timed_steps(
    session: &mut Session,
    family: &str,
    steps: std::ops::Range<usize>,
) -> anyhow::Result<Vec<f64>> {
    steps
        .map(|step| {
            let t0 = Instant::now();
            if let Some(f) = session.step(step)? {
                anyhow::bail!("{family} became unstable: {}", f.signature);
            }
            Ok(t0.elapsed().as_secs_f64())
        })
        .collect()
}

/// Median seconds per step of one session with the probe on (the workload).
fn step_time(case: &Case, steps: usize) -> anyhow::Result<f64> {
    let factory = BuiltinFactory::new(&case.model).expect("built-in");
    let mut session = Session::new(case, &factory, &RunOptions::default())?;
    let mut times = timed_steps(&mut session, case.family(), 0..steps + 3)?;
    Ok(median(times.split_off(3)))
}

/// The probe's overhead: the median over steps of (step time with the
/// probe) / (the same step without it), over `steps` steps of each after 3
/// warm-up steps. The two runs are interleaved step by step, and which
/// goes first alternates (neither always finds the caches the other left),
/// so that a pair sees one machine state: a ratio per pair cancels the
/// drift that medians of the two columns carry over a run.
fn probe_overhead(case: &Case, steps: usize) -> anyhow::Result<f64> {
    let factory = BuiltinFactory::new(&case.model).expect("built-in");
    let session = |probe| {
        let opts = RunOptions::default().with_probe(probe);
        Session::new(case, &factory, &opts)
    };
    let (mut on, mut off) = (session(true)?, session(false)?);
    let mut ratios = Vec::with_capacity(steps);
    for step in 0..steps + 3 {
        let mut times = [0.0; 2];
        let mut order = [(&mut on, 0), (&mut off, 1)];
        if step % 2 == 1 {
            order.reverse();
        }
        for (s, slot) in order {
            let t0 = Instant::now();
            if let Some(f) = s.step(step)? {
                anyhow::bail!("{} became unstable: {}", case.family(), f.signature);
            }
            times[slot] = t0.elapsed().as_secs_f64();
        }
        if step >= 3 {
            ratios.push(times[0] / times[1]);
        }
    }
    Ok(median(ratios) - 1.0)
}

/// The serve mode: warm-up steps, then `N` read → N steps timed.
fn serve(family: &str) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let c = case(family, 0);
    let factory = BuiltinFactory::new(&c.model).expect("built-in");
    let mut session = Session::new(&c, &factory, &RunOptions::default())?;
    let mut next = 0;
    let mut run = |n: usize| {
        next += n;
        timed_steps(&mut session, family, next - n..next)
    };
    run(3)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{{\"ready\": true}}")?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let n: usize = line?.trim().parse()?;
        let times = run(n)?.iter().map(f64::to_string).collect::<Vec<_>>();
        writeln!(out, "{{\"times\": [{}]}}", times.join(", "))?;
        out.flush()?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    nanhunt::device::retain_freed_memory(); // as the nanhunt binary does
    if std::env::args().nth(1).as_deref() == Some("builds") {
        // What this binary's kernels run on, for the table's header.
        let kernels = nanhunt::kernels::Vectors::Widest.isa().name();
        let gemm = nanhunt::kernels::gemm_isa().name();
        // The fused kernels keep gemm's small-dimension paths on AVX2
        // (kernels/gemm.rs): say so where the general path is wider.
        let small = match gemm {
            "avx512" => " (small-dimension paths avx2)",
            _ => "",
        };
        println!("nanhunt builds: fused kernels {kernels}, matrix products (gemm) {gemm}{small}");
        return Ok(());
    }
    if std::env::args().nth(1).as_deref() == Some("serve") {
        let family = std::env::args()
            .nth(2)
            .unwrap_or_else(|| "transformer".into());
        return serve(&family);
    }
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
        let overhead = probe_overhead(&c, steps)?;
        println!(
            "{{\"framework\": \"nanhunt\", \"family\": \"{family}\", \"ms_per_step\": {}, \"probe_overhead\": {}}}",
            step * 1e3,
            overhead
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
