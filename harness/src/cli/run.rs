//! `nanhunt run CASE.json`: run one case and print the verdict.

use super::{case_arg, Exit, LimitArgs};
use crate::spec::DeviceSpec;
use crate::{Outcome, RunOptions, Trace};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The case file (JSON; `nanhunt example` prints one).
    /// (Optional in a binary built with `nanhunt::cli::main_with`: its model\'s own case.)
    case: Option<PathBuf>,
    /// Print one machine-readable JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Run on this device instead of the case's (`cpu`, `cuda`, `cuda:N`).
    #[arg(long)]
    device: Option<DeviceSpec>,
    /// Watch only the loss (no per-step scans of gradients and parameters).
    #[arg(long, conflicts_with = "dump")]
    no_probe: bool,
    /// On the first failure, write a crash dump to this directory (it must not exist).
    #[arg(long)]
    dump: Option<PathBuf>,
    /// With --dump: write the scene of this step (0-based) whether or not
    /// it fails; a failure before it is dumped instead.
    #[arg(long, requires = "dump", value_name = "STEP")]
    dump_at: Option<usize>,
    /// At the first step, check every gradient along a random direction
    /// against the loss's finite difference (four extra forward passes per
    /// trainable tensor, once): a present but wrong gradient is a finding.
    #[arg(long)]
    check_gradients: bool,
    #[command(flatten)]
    limits: LimitArgs,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let limits = args.limits.limits();
    let (case, path) = case_arg(args.case.as_deref(), &limits)?;
    let mut opts = RunOptions::default()
        .with_limits(limits)
        .with_probe(!args.no_probe)
        .with_gradient_check(args.check_gradients);
    opts.device = args.device;
    opts.dump = args.dump.clone();
    opts.dump_at = args.dump_at;
    let factory = super::factory_of(&case)?;
    let outcome = crate::run_model(&case, factory.get(), &opts).map_err(super::in_file(&path))?;
    if args.json {
        println!("{}", serde_json::to_string(&outcome)?);
    } else {
        let device = args.device.unwrap_or(case.device);
        println!(
            "case: {} / {} / {} / {} on {device}, {} steps, batch {}",
            case.family(),
            case.loss.name(),
            case.optimizer.name(),
            case.precision.name(),
            case.steps,
            case.batch_size
        );
        if let crate::spec::SourceSpec::File(f) = &case.data.source {
            let drawn = f
                .sampling
                .indices
                .as_ref()
                .map_or(String::new(), |i| format!(", {} samples named", i.len()));
            println!("data: {}{drawn}", f.path.display());
        }
        print_outcome(&outcome);
        match (&args.dump, &outcome, args.dump_at) {
            (Some(dir), Outcome::Unstable { finding }, at)
                if at.is_none_or(|a| finding.step <= a) =>
            {
                println!("  crash dump: {}", dir.display())
            }
            (Some(dir), _, Some(at)) => println!("  scene of step {at}: {}", dir.display()),
            (Some(dir), Outcome::Stable { .. }, None) => println!(
                "  no crash dump in {}: the run stayed stable (`--dump-at STEP` writes the scene of a step whether or not it fails)",
                dir.display()
            ),
            _ => {}
        }
    }
    Ok(match outcome {
        Outcome::Stable { .. } => Exit::Clean,
        Outcome::Unstable { .. } => Exit::Found,
        Outcome::Rejected { reason } => {
            eprintln!("error: {}: {reason}", path.display());
            Exit::Error
        }
    })
}

fn print_outcome(outcome: &Outcome) {
    match outcome {
        Outcome::Stable { trace } => {
            println!("verdict: STABLE");
            print_summary(trace);
        }
        Outcome::Unstable { finding } => {
            println!(
                "verdict: UNSTABLE at step {}: {} in {} at `{}`",
                finding.step,
                finding.kind.as_str(),
                finding.phase.as_str(),
                finding.stage
            );
            println!("  {}", finding.detail);
            if let Some(s) = &finding.stats {
                println!(
                    "  tensor {:?}: {} NaN, {} Inf of {}; finite mean {:.4e}, min {:.4e}, max {:.4e}",
                    s.shape, s.nan, s.inf, s.count, s.mean, s.min, s.max
                );
            }
            if let Some(e) = &finding.explanation {
                println!("  explanation: {}; the repair: {}", e.sentence, e.repair);
                if let Some(code) = e.repair_code() {
                    println!("  as code: {code}");
                }
            }
            if let Some(check) = &finding.precision {
                println!("  precision: {}", check.summary());
                if let Some(mark) = &check.framework {
                    println!("  framework: {}", mark.summary());
                }
            }
            println!("  signature: {}", finding.signature.slug());
            print_summary(&finding.trace);
        }
        // The reason is the error line (stderr): said once.
        Outcome::Rejected { .. } => println!("verdict: REJECTED"),
    }
}

fn print_summary(trace: &Trace) {
    let losses = &trace.losses;
    if let (Some(first), Some(last)) = (losses.first(), losses.last()) {
        let min = losses
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .fold(f64::INFINITY, f64::min);
        println!(
            "  loss: {first:.4} -> {last:.4} (min {min:.4}) over {} steps",
            losses.len()
        );
    }
    if let (Some(first), Some(last)) = (trace.grad_norms.first(), trace.grad_norms.last()) {
        println!("  grad norm: {first:.4} -> {last:.4}");
    }
    if trace.skipped_steps > 0 {
        println!("  steps skipped by loss scaling: {}", trace.skipped_steps);
    }
    let tail: Vec<String> = losses
        .iter()
        .rev()
        .take(5)
        .rev()
        .map(|v| format!("{v:.4e}"))
        .collect();
    println!("  last losses: [{}]", tail.join(", "));
    for w in &trace.warnings {
        println!("  warning: {w}");
    }
}
