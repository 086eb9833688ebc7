//! The guard's overhead as a ratio measured in one run: a plain candle loop
//! (forward, loss, `backward`, the optimizer's step) against the same loop
//! through `Guard::step`, steps interleaved so that machine noise hits both
//! alike, the overhead the median of the per-step ratios. Each built-in
//! family at its side-by-side (`--size large`) size, its model built on a candle `VarMap` as a user's
//! would be, and one third-party model: candle-transformers' EfficientNet-B0
//! (differentiable throughout in candle 0.11.1) on 32×32 images. The
//! small loops are each measured in [`PROCESSES`] child processes of the
//! bench, the figure their median, their range beside it.
//! Run: `cargo bench -p nanhunt --bench guard_overhead [FAMILY ...] [small|large]`
//! (RAYON_NUM_THREADS=1 for the single-thread figure). With `same-plain` or
//! `same-guarded` both loops are the same kind: the bench's own bias, which
//! should read about 0%.

#[path = "shared/guard_loop.rs"]
mod guard_loop;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use nanhunt::data::Generator;
use nanhunt::guard::{Batch, Guard, GuardOptions, NanhuntOptimizer};
use nanhunt::models::{BuiltinFactory, Model, ModelFactory};
use nanhunt::spec::{Size, FAMILIES};
use nanhunt::Case;
use std::time::Instant;

const STEPS: usize = 200;
const WARMUP: usize = 20;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Builds the family's model on a VarMap's variables (as a user's loop does).
type Build = Box<dyn Fn(&VarMap) -> Box<dyn Model>>;

struct Loop {
    varmap: VarMap,
    model_of: Build,
    opt: NanhuntOptimizer,
    guard: Option<Guard>,
}

/// The processes each small loop is measured in, one after another. A
/// process's figure carries where address-space randomization put its
/// memory: six processes of the small LSTM's pair read −1.22% to 2.23%
/// (1.32% to 1.78% with randomization off), while two loops of the same
/// kind agree within 0.05%. The median over processes averages over
/// those layouts.
const PROCESSES: usize = 5;

/// Set in a child process: the family whose small loop it measures.
const CHILD: &str = "NANHUNT_GUARD_BENCH_CHILD";

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let same = args.iter().find(|a| a.starts_with("same-")).cloned();
    // Which kind each loop is: (the "guarded" column's, the "plain" one's).
    let kinds = match same.as_deref() {
        Some("same-plain") => (false, false),
        Some("same-guarded") => (true, true),
        _ => (true, false),
    };
    let filter: Vec<String> = args
        .into_iter()
        .filter(|a| !a.starts_with("same-"))
        .collect();
    nanhunt::device::retain_freed_memory();
    if let Ok(family) = std::env::var(CHILD) {
        let (ratio, m_on, m_off) = summary(measure(&family, Size::Small, kinds));
        println!("{ratio} {m_on} {m_off}");
        return;
    }
    println!(
        "{:20} {:>12} {:>12} {:>9}",
        "family", "guarded", "plain", "overhead"
    );
    // Small sizes are loops of tens to hundreds of µs a step, where the
    // guard's fixed cost per step shows; large ones are milliseconds.
    let sizes = [(Size::Small, "small"), (Size::Large, "large")];
    for (family, (size, size_name)) in FAMILIES
        .iter()
        .flat_map(|f| sizes.iter().map(move |s| (*f, *s)))
    {
        if !selected(&filter, family, size_name) {
            continue;
        }
        let name = format!("{family} ({size_name})");
        match size {
            Size::Small => small_in_processes(&name, family, same.as_deref()),
            _ => report(&name, summary(measure(family, size, kinds)), None),
        }
    }
    if filter.is_empty() || filter.iter().any(|f| "efficientnet".contains(f.as_str())) {
        efficientnet();
    }
}

/// The family's loop at `size`, guarded and plain (or as `kinds` says),
/// steps interleaved: each loop's step times in ms.
fn measure(family: &str, size: Size, kinds: (bool, bool)) -> (Vec<f64>, Vec<f64>) {
    let case = Case::example_sized(family, size).unwrap();
    let generator = Generator::new(&case);
    let batches: Vec<Batch> = (0..8)
        .map(|s| guard_loop::to_batch(&generator.batch(s, case.batch_size)))
        .collect();
    let make = |guarded: bool| {
        let varmap = VarMap::new();
        let spec = case.model.clone();
        let model_of: Build = Box::new(move |vm| {
            let vb = VarBuilder::from_varmap(vm, DType::F32, &Device::Cpu);
            BuiltinFactory::new(&spec).unwrap().build(vb).unwrap()
        });
        model_of(&varmap);
        let guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
        let opt = guard.optimizer(case.optimizer.clone()).unwrap();
        Loop {
            varmap,
            model_of,
            opt,
            guard: guarded.then_some(guard),
        }
    };
    let (mut on, mut off) = (make(kinds.0), make(kinds.1));
    let loss = case.loss.clone();
    let (mut t_on, mut t_off) = (Vec::new(), Vec::new());
    // Small loops take more steps: a per-step difference of a
    // microsecond needs thousands of pairs for its median to hold
    // still in this machine's noise (a second or two a loop).
    let steps = if size == Size::Small {
        15 * STEPS
    } else {
        STEPS
    };
    for step in 0..steps + WARMUP {
        let b = &batches[step % batches.len()];
        let mut pair = [(&mut on, &mut t_on), (&mut off, &mut t_off)];
        // Which loop goes first alternates: neither gets the warmer caches.
        if step % 2 == 1 {
            pair.reverse();
        }
        for (l, times) in pair {
            let start = Instant::now();
            let model = (l.model_of)(&l.varmap);
            let loss_of = |b: &Batch| guard_loop::loss_of(&*model, &loss, b);
            match &mut l.guard {
                Some(g) => {
                    g.step(step, b, &mut l.opt, loss_of).expect("stays stable");
                }
                None => guard_loop::plain_step(&mut l.opt, loss_of(b).unwrap()),
            }
            if step >= WARMUP {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    (t_on, t_off)
}

/// The family's small loop measured in [`PROCESSES`] child processes of
/// this bench, one after another; the median of their overheads (and of
/// their step times), with their range.
fn small_in_processes(name: &str, family: &str, same: Option<&str>) {
    let exe = std::env::current_exe().expect("the bench's own path");
    let figures: Vec<[f64; 3]> = (0..PROCESSES)
        .map(|_| {
            let out = std::process::Command::new(&exe)
                .args(same)
                .env(CHILD, family)
                .output()
                .expect("the bench runs itself");
            assert!(out.status.success(), "{family}: {out:?}");
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().last().unwrap_or_default();
            let v: Vec<f64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
            [v[0], v[1], v[2]]
        })
        .collect();
    let column = |k: usize| median(&mut figures.iter().map(|f| f[k]).collect::<Vec<_>>());
    let (ratio, m_on, m_off) = (column(0), column(1), column(2));
    let ratios = figures.iter().map(|f| f[0]);
    let range = (
        ratios.clone().fold(f64::INFINITY, f64::min),
        ratios.fold(f64::NEG_INFINITY, f64::max),
    );
    report(name, (ratio, m_on, m_off), Some(range));
}

/// Whether the arguments select this family at this size: `rnn` runs
/// both of its sizes, `small` every family's small one, `rnn small` one.
fn selected(filter: &[String], family: &str, size: &str) -> bool {
    let sizes = ["small", "large"];
    let (wanted_sizes, wanted): (Vec<&String>, Vec<&String>) =
        filter.iter().partition(|f| sizes.contains(&f.as_str()));
    let family_wanted = wanted.is_empty() || wanted.iter().any(|f| family.contains(f.as_str()));
    family_wanted && (wanted_sizes.is_empty() || wanted_sizes.iter().any(|s| *s == size))
}

/// The overhead as the median of the per-step ratios of a pair run back
/// to back (a pair shares the machine's speed of that moment, so a slow
/// minute that hits some steps moves their ratios far less than it moves
/// either loop's median), and the medians of each loop's times.
fn summary((mut on, mut off): (Vec<f64>, Vec<f64>)) -> (f64, f64, f64) {
    let mut ratios: Vec<f64> = on.iter().zip(off.iter()).map(|(a, b)| a / b).collect();
    (median(&mut ratios), median(&mut on), median(&mut off))
}

/// A line of the table; `range`: the lowest and highest ratio of the
/// processes a small loop was measured in.
fn report(name: &str, (ratio, m_on, m_off): (f64, f64, f64), range: Option<(f64, f64)>) {
    let percent = |r: f64| (r - 1.0) * 100.0;
    let processes = range.map_or(String::new(), |(lo, hi)| {
        format!(
            "; {PROCESSES} processes {:.2}% to {:.2}%",
            percent(lo),
            percent(hi)
        )
    });
    println!(
        "{name:20} {m_on:>9.3} ms {m_off:>9.3} ms {:>8.2}% ({:+.1} µs a step{processes})",
        percent(ratio),
        (ratio - 1.0) * m_off * 1e3
    );
}

/// candle-transformers' EfficientNet-B0, 10 classes, batch 4 of 3×32×32.
fn efficientnet() {
    use candle_core::Module;
    use candle_transformers::models::efficientnet::{EfficientNet, MBConvConfig};
    const STEPS: usize = 40;
    const WARMUP: usize = 4;
    let dev = Device::Cpu;
    let mut rng = nanhunt::rng::Rng::new(0);
    let x: Vec<f32> = (0..4 * 3 * 32 * 32).map(|_| rng.normal() as f32).collect();
    let t: Vec<f32> = (0..4 * 10)
        .map(|i| if i % 10 == (i / 10) % 10 { 1.0 } else { 0.0 })
        .collect();
    let batch = Batch::new([
        ("x", Tensor::from_vec(x, (4, 3, 32, 32), &dev).unwrap()),
        ("t", Tensor::from_vec(t, (4, 10), &dev).unwrap()),
    ]);
    let spec = nanhunt::spec::LossSpec::CrossEntropy {
        label_smoothing: 0.0,
    };
    let adam = nanhunt::spec::OptimizerSpec::Adam {
        lr: 1e-4,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let make = || {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let model = EfficientNet::new(vb, MBConvConfig::b0(), 10).unwrap();
        let guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
        let opt = guard.optimizer(adam.clone()).unwrap();
        (model, guard, opt)
    };
    let (m_on, mut guard, mut opt_on) = make();
    let (m_off, _, mut opt_off) = make();
    let (mut t_on, mut t_off) = (Vec::new(), Vec::new());
    for step in 0..STEPS + WARMUP {
        // Which loop goes first alternates: neither gets the warmer caches.
        for guarded in [step % 2 == 0, step % 2 == 1] {
            let start = Instant::now();
            if guarded {
                guard
                    .step(step, &batch, &mut opt_on, |b| {
                        let logits = m_on.forward(b.get("x")?)?;
                        nanhunt::losses::loss(&spec, &logits, b.get("t")?)
                    })
                    .expect("EfficientNet-B0 trains");
            } else {
                let logits = m_off.forward(batch.get("x").unwrap()).unwrap();
                let loss = nanhunt::losses::loss(&spec, &logits, batch.get("t").unwrap()).unwrap();
                guard_loop::plain_step(&mut opt_off, loss);
            }
            if step >= WARMUP {
                let ms = start.elapsed().as_secs_f64() * 1e3;
                if guarded {
                    t_on.push(ms)
                } else {
                    t_off.push(ms)
                }
            }
        }
    }
    report("efficientnet-b0 (ct)", summary((t_on, t_off)), None);
}
