//! `nanhunt inspect DIR`: the scene of any dump in a terminal — a guard's
//! (`scene.json`) or a case run's (`stats.json`): the finding, the recent
//! losses, gradient norms, tensor statistics and the environment.

use super::Exit;
use nanhunt::dump::{Dump, Environment};
use nanhunt::guard::{GuardScene, OptimizerRecord, SCENE_FILE};
use nanhunt::outcome::Finding;
use nanhunt::probe::TensorStats;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A dump directory (`run --dump`, or a guard's scene).
    dir: PathBuf,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    if args.dir.join(SCENE_FILE).is_file() {
        let (scene, _) = GuardScene::load(&args.dir)?;
        println!("guard scene: {}", args.dir.display());
        finding(&scene.finding);
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
    } else {
        let dump =
            Dump::load(&args.dir, &candle_core::Device::Cpu).map_err(super::in_file(&args.dir))?;
        println!("dump: {}", args.dir.display());
        println!(
            "case: {} / {} / {} / {}, {} steps, batch {}",
            dump.case.family(),
            dump.case.loss.name(),
            dump.case.optimizer.name(),
            dump.case.precision.name(),
            dump.case.steps,
            dump.case.batch_size
        );
        match &dump.stats.finding {
            Some(f) => finding(f),
            None => println!("step {}: healthy (dumped on request)", dump.stats.step),
        }
        if let Some(lambda) = dump.stats.mix_lambda {
            println!("  mixed batch: lambda {lambda}");
        }
        history(&dump.stats.recent_losses, &dump.stats.grad_norms);
        tensors(&dump.stats.tensors);
        environment(&dump.stats.environment);
    }
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
