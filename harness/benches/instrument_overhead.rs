//! What `#[nanhunt::instrument]` costs outside traced re-runs: the same
//! user's model written twice (one body, expanded by a macro, once with
//! the attribute), trained by the guard in a user's loop and by the runner
//! with its probe on; the two models' steps interleaved, their order
//! alternating, the figure the median of the per-step ratios. The model is
//! a small attention block by hand (a layer norm, q·kᵀ scaled, a softmax,
//! a residual and two linear layers: 23 ops a step, each a flag read when
//! instrumented), at a small and a larger width.
//! Run: `cargo bench -p nanhunt --bench instrument_overhead [ROUNDS] [same]`
//! (RAYON_NUM_THREADS=1 for the single-thread figure); each round measures
//! every pair once, the rounds one after another. With `same` both models
//! are plain: the bench's own bias, the noise the figures are read against.

// Its batches and loss; the plain (unguarded) step is the guard bench's.
#[path = "shared/guard_loop.rs"]
#[allow(dead_code)]
mod guard_loop;

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{linear, Linear, VarBuilder, VarMap};
use nanhunt::guard::{Batch, Guard, GuardOptions, NanhuntOptimizer};
use nanhunt::models::{Model, ModelFactory, Tracer};
use nanhunt::runner::Session;
use nanhunt::spec::{Case, CustomSpec, InputSpec, LossSpec, ModelSpec, OptimizerSpec};
use nanhunt::RunOptions;
use std::time::Instant;

const STEPS: usize = 400;
const WARMUP: usize = 20;

/// An attention block over `tokens` positions of `width`, by hand.
struct Block {
    q: Linear,
    k: Linear,
    head: Linear,
    tokens: usize,
    instrumented: bool,
}

/// The block's forward pass, once plain and once instrumented: one body.
macro_rules! block_forward {
    ($name:ident $(, #[$attr:meta])?) => {
        $(#[$attr])?
        fn $name(b: &Block, x: &Tensor) -> candle_core::Result<Tensor> {
            let (n, features) = x.dims2()?;
            let h = x.reshape((n, b.tokens, features / b.tokens))?;
            let mean = h.mean_keepdim(D::Minus1)?;
            let c = h.broadcast_sub(&mean)?;
            let var = c.sqr()?.mean_keepdim(D::Minus1)?;
            let h = c.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
            let q = b.q.forward(&h)?;
            let k = b.k.forward(&h)?;
            let d = (features / b.tokens) as f64;
            let scores = (q.matmul(&k.t()?)? / d.sqrt())?;
            let w = candle_nn::ops::softmax(&scores, D::Minus1)?;
            let ctx = (w.matmul(&h)? + &h)?;
            b.head.forward(&ctx.mean(1)?)
        }
    };
}

block_forward!(plain_forward);
block_forward!(instrumented_forward, #[nanhunt::instrument]);

impl Model for Block {
    fn forward(&self, x: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
        match self.instrumented {
            true => instrumented_forward(self, x),
            false => plain_forward(self, x),
        }
    }
}

/// Whether the "instrumented" loop is instrumented (not with `same`).
fn instrumenting() -> bool {
    !std::env::args().any(|a| a == "same")
}

fn factory(width: usize, instrumented: bool) -> impl ModelFactory {
    let instrumented = instrumented && instrumenting();
    move |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let part = width / 4;
        Ok(Box::new(Block {
            q: linear(part, part, vb.pp("q"))?,
            k: linear(part, part, vb.pp("k"))?,
            head: linear(part, 4, vb.pp("head"))?,
            tokens: 4,
            instrumented,
        }))
    }
}

fn case(width: usize) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(
        "block",
        InputSpec::Vector { features: width },
        4,
    ));
    c.optimizer = OptimizerSpec::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    c.batch_size = 16;
    c.steps = 100_000;
    c
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median of the per-step ratios (instrumented / plain) and the two
/// medians, from interleaved steps of `step(instrumented, step)`.
fn interleaved(mut step: impl FnMut(bool, usize)) -> (f64, f64, f64) {
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for s in 0..STEPS + WARMUP {
        let order = if s % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for instrumented in order {
            let start = Instant::now();
            step(instrumented, s);
            if s >= WARMUP {
                let ms = start.elapsed().as_secs_f64() * 1e3;
                if instrumented {
                    on.push(ms)
                } else {
                    off.push(ms)
                }
            }
        }
    }
    let mut ratios: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b).collect();
    (median(&mut ratios), median(&mut on), median(&mut off))
}

/// The guard in a user's loop over the block.
fn guarded(width: usize) -> (f64, f64, f64) {
    let c = case(width);
    let batches: Vec<Batch> = (0..8)
        .map(|s| guard_loop::to_batch(&nanhunt::data::Generator::new(&c).batch(s, c.batch_size)))
        .collect();
    let make = |instrumented: bool| {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let model = factory(width, instrumented).build(vb).unwrap();
        let guard = Guard::new(&varmap, GuardOptions::default()).unwrap();
        let opt: NanhuntOptimizer = guard.optimizer(c.optimizer.clone()).unwrap();
        (model, guard, opt)
    };
    let mut loops = [make(false), make(true)];
    let loss = LossSpec::CrossEntropy {
        label_smoothing: 0.0,
    };
    interleaved(|instrumented, step| {
        let (model, guard, opt) = &mut loops[usize::from(instrumented)];
        let b = &batches[step % batches.len()];
        guard
            .step(step, b, opt, |b| guard_loop::loss_of(&**model, &loss, b))
            .expect("the block trains");
    })
}

/// The runner's session with its probe on over the block.
fn runner(width: usize) -> (f64, f64, f64) {
    let c = case(width);
    let (f_off, f_on) = (factory(width, false), factory(width, true));
    let opts = RunOptions::default();
    let mut sessions = [
        Session::new(&c, &f_off, &opts).unwrap(),
        Session::new(&c, &f_on, &opts).unwrap(),
    ];
    interleaved(|instrumented, step| {
        let s = &mut sessions[usize::from(instrumented)];
        assert!(s.step(step).unwrap().is_none(), "the block trains");
    })
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1);
    nanhunt::device::retain_freed_memory();
    println!(
        "{:28} {:>12} {:>12} {:>9}",
        "loop", "instrumented", "plain", "overhead"
    );
    for round in 1..=rounds {
        for width in [32, 256] {
            for (driver, run) in [
                ("guard", guarded as fn(usize) -> _),
                ("runner, probe on", runner),
            ] {
                let (ratio, on, off) = run(width);
                println!(
                    "{:28} {on:>9.4} ms {off:>9.4} ms {:>8.2}%",
                    format!("round {round}: {driver}, width {width}"),
                    (ratio - 1.0) * 100.0
                );
            }
        }
    }
}
