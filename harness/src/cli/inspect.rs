//! `nanhunt inspect DIR`: the scene of any dump in a terminal — a guard's
//! or a case run's (one format; a run's dump adds its case): the finding,
//! the optimizer, the recent losses, gradient norms, the batch, tensor
//! statistics, warnings and the environment.

use super::Exit;
use crate::finding::Finding;
use crate::probe::TensorStats;
use crate::scene::{Environment, OptimizerRecord, SavedScene};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A dump directory (`run --dump`, or a guard's scene).
    dir: PathBuf,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let saved = SavedScene::load(&args.dir).map_err(super::in_file(&args.dir))?;
    let scene = &saved.scene;
    match &saved.case {
        Some(case) => {
            println!("dump: {}", args.dir.display());
            println!(
                "case: {} / {} / {} / {}, {} steps, batch {}",
                case.family(),
                case.loss.name(),
                case.optimizer.name(),
                case.precision.name(),
                case.steps,
                case.batch_size
            );
        }
        None => println!("guard scene: {}", args.dir.display()),
    }
    match &scene.finding {
        Some(f) => finding(f),
        None => println!("step {}: healthy (dumped on request)", scene.step),
    }
    match &scene.optimizer {
        OptimizerRecord::Saved { spec, steps } => println!(
            "optimizer: {} (lr {:e}), {steps} steps, state saved",
            spec.name(),
            spec.lr()
        ),
        OptimizerRecord::NotAvailable { name } => {
            println!("optimizer: {name}, state not available (private to it)")
        }
    }
    if let Some(lambda) = scene.mix_lambda {
        println!("  mixed batch: lambda {lambda}");
    }
    history(&scene.recent_losses, &scene.grad_norms);
    println!("batch:");
    for p in &scene.batch {
        println!("  {:<24} {:<5} {}", p.name, p.dtype, stats(&p.stats));
    }
    tensors(&scene.tensors);
    for w in &scene.warnings {
        println!("warning: {w}");
    }
    if !scene.omitted.is_empty() {
        println!("left out of the scene: {}", scene.omitted.join(", "));
    }
    environment(&scene.environment);
    Ok(Exit::Clean)
}

fn finding(f: &Finding) {
    println!(
        "finding: {} in {} at `{}`, step {}",
        f.kind.as_str(),
        f.phase.as_str(),
        f.stage,
        f.step
    );
    println!("  {}", f.detail);
    println!("  signature: {}", f.signature.slug());
}

fn history(losses: &[f64], norms: &[f64]) {
    let show = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.4e}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("recent losses: [{}]", show(losses));
    let tail = &norms[norms.len().saturating_sub(10)..];
    println!("gradient norms (last {}): [{}]", tail.len(), show(tail));
}

fn stats(s: &TensorStats) -> String {
    format!(
        "{:?}: {} NaN, {} Inf of {}; mean {:.4e}, min {:.4e}, max {:.4e}",
        s.shape, s.nan, s.inf, s.count, s.mean, s.min, s.max
    )
}

fn tensors(t: &BTreeMap<String, TensorStats>) {
    println!("tensors:");
    for (name, s) in t {
        let flag = if s.nan + s.inf > 0 { "!" } else { " " };
        println!("{flag} {name:<40} {}", stats(s));
    }
}

fn environment(e: &Environment) {
    println!(
        "environment: {} on {} {}, {} cores{}",
        e.device,
        e.os,
        e.arch,
        e.available_cores,
        e.process_peak_kib
            .map(|k| format!(", peak memory {} MiB", k / 1024))
            .unwrap_or_default()
    );
}
