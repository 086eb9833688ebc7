//! The probe's overhead as a ratio measured in one run: steps with the probe
//! on and off are interleaved (so machine noise hits both alike), and the
//! medians are compared. Run: `cargo bench -p nanhunt --bench probe_overhead`
//! (set RAYON_NUM_THREADS=1 for the single-thread figure). Each family runs
//! at its default size and at `--size large` (the side-by-side models).

use nanhunt::models::BuiltinFactory;
use nanhunt::runner::Session;
use nanhunt::spec::{Size, FAMILIES};
use nanhunt::{Case, Limits, RunOptions};
use std::time::Instant;

const STEPS: usize = 300;
const WARMUP: usize = 20;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument, if any, selects families.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    nanhunt::device::retain_freed_memory(); // as the nanhunt binary does
    println!(
        "{:20} {:>12} {:>12} {:>9}",
        "family", "probe on", "probe off", "overhead"
    );
    let sizes = [Size::Default, Size::Large];
    for (family, size) in FAMILIES.iter().flat_map(|f| sizes.map(|s| (*f, s))) {
        if !filter.is_empty() && !filter.iter().any(|f| family.contains(f.as_str())) {
            continue;
        }
        let mut case = Case::example_sized(family, size).unwrap();
        case.steps = 100_000;
        let factory = BuiltinFactory::new(&case.model).unwrap();
        let session = |probe| {
            let opts = RunOptions::default()
                .with_probe(probe)
                .with_limits(Limits::default());
            Session::new(&case, &factory, &opts).unwrap()
        };
        let (mut on, mut off) = (session(true), session(false));
        let (mut t_on, mut t_off) = (Vec::new(), Vec::new());
        for step in 0..STEPS + WARMUP {
            for (s, times) in [(&mut on, &mut t_on), (&mut off, &mut t_off)] {
                let start = Instant::now();
                assert!(s.step(step).unwrap().is_none(), "{family} must stay stable");
                if step >= WARMUP {
                    times.push(start.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        let (m_on, m_off) = (median(&mut t_on), median(&mut t_off));
        let name = format!(
            "{family} ({})",
            if size == Size::Large {
                "large"
            } else {
                "default"
            }
        );
        println!(
            "{name:20} {m_on:>9.3} ms {m_off:>9.3} ms {:>8.2}%",
            (m_on / m_off - 1.0) * 100.0
        );
    }
}
