//! `nanhunt diff CASE.json --devices cpu,cuda:0 | --precisions … | --threads …`:
//! run the case on each arm and report where they part ways.

use super::{case_arg, Exit, LimitArgs};
use crate::differential::{compare, Arms, Differential, Tolerance};
use crate::spec::{DeviceSpec, Precision};
use crate::RunOptions;
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("arms").required(true).args(["devices", "precisions", "threads"])))]
pub struct Args {
    /// The case file.
    /// (Optional in a binary built with `nanhunt::cli::main_with`: its model\'s own case.)
    case: Option<PathBuf>,
    /// Compare devices (the first is the reference): cpu,cuda:0.
    #[arg(long, value_delimiter = ',')]
    devices: Vec<DeviceSpec>,
    /// Compare precisions: f64,f32,bf16,f16,mixed_f16,mixed_bf16.
    #[arg(long, value_delimiter = ',')]
    precisions: Vec<Precision>,
    /// Compare compute thread counts on the case's device: 1,2.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=super::MAX_THREADS))]
    threads: Vec<u64>,
    /// bitwise, tight (rel 1e-4), loose (rel 5e-2) or a relative tolerance;
    /// default: bitwise for threads, loose with a half precision, else tight.
    #[arg(long, value_parser = Tolerance::parse)]
    tolerance: Option<Tolerance>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    limits: LimitArgs,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let limits = args.limits.limits();
    let (case, path) = case_arg(args.case.as_deref(), &limits)?;
    let arms = if !args.devices.is_empty() {
        Arms::Devices(args.devices.clone())
    } else if !args.precisions.is_empty() {
        Arms::Precisions(args.precisions.clone())
    } else {
        Arms::Threads(args.threads.iter().map(|&t| t as usize).collect())
    };
    let tolerance = args
        .tolerance
        .unwrap_or_else(|| Tolerance::default_for(&arms, &case));
    let opts = RunOptions::default().with_limits(limits);
    let d = compare(&case, None, &arms, tolerance, &opts).map_err(super::in_file(&path))?;
    if args.json {
        println!("{}", serde_json::to_string(&d)?);
    } else {
        print_text(&d);
    }
    Ok(if d.agrees() { Exit::Clean } else { Exit::Found })
}

fn print_text(d: &Differential) {
    let t = &d.tolerance;
    println!(
        "tolerance: {} (|a-b| <= {:e} + {:e} * max(|a|,|b|)); reference: {}",
        t.name, t.abs, t.rel, d.reference
    );
    for arm in &d.arms {
        let what = match (&arm.signature, arm.finding_step) {
            (Some(s), Some(step)) => format!("unstable at step {step}: {}", s.slug()),
            _ => format!(
                "stable, final loss {}",
                arm.losses.last().map_or("-".into(), |l| format!("{l:.6e}"))
            ),
        };
        println!("  {:<12} {} steps run, {what}", arm.label, arm.losses.len());
    }
    for (label, worst) in &d.max_rel_diff {
        println!(
            "max relative loss difference, {label} vs {}: {worst:.3e}",
            d.reference
        );
    }
    for x in &d.disagreements {
        println!(
            "first disagreement: {} at step {}: {} {:.9e} vs {:.9e} (relative {:.3e})",
            x.arm, x.step, x.quantity, x.value, x.reference, x.rel_diff
        );
    }
    for o in &d.one_sided {
        println!(
            "non-finite on {} only: step {} ({}); finite on {}",
            o.arm,
            o.step,
            o.signature.slug(),
            o.finite_on.join(", ")
        );
    }
    println!("verdict: {}", if d.agrees() { "AGREE" } else { "DISAGREE" });
}
