//! `nanhunt hunt [CASE.json]`: the trigger search for latent NaNs. Writes
//! the risk report (`risk.md`, `risk.json`, `risk.html`) and one reproducer
//! scene per trigger (`reproducers/SIGNATURE/`) under `--out`; prints the
//! Markdown report (or the JSON with `--json`). Exit 1 when a stage fired
//! or was triggered.

use super::{case_arg, Exit, LimitArgs};
use crate::campaign::parse_duration;
use crate::hunt::{hunt, HuntOptions};
use crate::spec::DeviceSpec;
use crate::RunOptions;
use std::path::PathBuf;
use std::time::Duration;

/// Where a hunt writes its report and reproducers by default.
const DEFAULT_OUT: &str = "nanhunt-out/hunt";

#[derive(clap::Args)]
pub struct Args {
    /// The case file (JSON; `nanhunt example` prints one).
    /// (Optional in a binary built with `nanhunt::cli::main_with`: its model's own case.)
    case: Option<PathBuf>,
    /// The largest input perturbation searched, in multiples of the data's
    /// scale (its largest magnitude).
    #[arg(long, default_value_t = 200.0, value_parser = parse_bound)]
    bound: f64,
    /// Sign-gradient steps per start of the input search.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pgd_steps: u64,
    /// Token inputs: the most tokens swapped per row (one per round, guided
    /// by the gradient through the embedding).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=10000))]
    token_swaps: u64,
    /// Search inputs only, not a drift of the weights at a higher learning rate.
    #[arg(long)]
    no_drift: bool,
    /// The report and the reproducers go here (created; earlier reproducers
    /// of the same signature are replaced).
    #[arg(long, default_value = DEFAULT_OUT)]
    out: PathBuf,
    /// Print the report as JSON instead of Markdown.
    #[arg(long)]
    json: bool,
    /// Run on this device instead of the case's (`cpu`, `cuda`, `cuda:N`).
    #[arg(long)]
    device: Option<DeviceSpec>,
    /// Stop searching after this long (90s, 15m, 2h): the stages left are
    /// reported as not searched.
    #[arg(long, value_parser = parse_duration)]
    budget: Option<Duration>,
    /// The longest one stage's search may take (90s, 15m): one cut off is
    /// reported as not searched to the bound.
    #[arg(long, value_parser = parse_duration)]
    case_timeout: Option<Duration>,
    #[command(flatten)]
    limits: LimitArgs,
}

fn parse_bound(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && v > 0.0 && v <= 1e6 {
        Ok(v)
    } else {
        Err(format!(
            "{s}: must be a positive multiple of the data's scale, at most 1e6"
        ))
    }
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    // Before anything else: nothing may be written there.
    if std::fs::canonicalize(&args.out).is_ok_and(|p| p.parent().is_none()) {
        anyhow::bail!(
            "--out {}: the file system's root is no output directory",
            args.out.display()
        );
    }
    let limits = args.limits.limits();
    let (case, path) = case_arg(args.case.as_deref(), &limits)?;
    let factory = super::factory_of(&case)?;
    if args.case_timeout.is_some_and(|d| d.is_zero()) {
        anyhow::bail!("--case-timeout: must be longer than 0 s");
    }
    let reproducers = args.out.join("reproducers");
    std::fs::create_dir_all(&reproducers).map_err(|e| crate::Error::io(&reproducers, e))?;
    // One writer at a time, as campaigns: a second hunt (or a campaign)
    // on this directory is refused, and what a killed one left is ours.
    let _lock = crate::journal::take_dir(&args.out, &[&reproducers])?;
    crate::files::check_writable(&args.out.join("risk.md"))?;
    let mut run = RunOptions::default().with_limits(limits);
    run.device = args.device;
    let mut opts = HuntOptions::default()
        .up_to(args.bound)
        .out_to(&reproducers)
        .within(args.budget, args.case_timeout);
    opts.pgd_steps = args.pgd_steps as usize;
    opts.token_swaps = args.token_swaps as usize;
    opts.run = run;
    if args.no_drift {
        opts = opts.without_drift();
    }
    let report = hunt(&case, factory.get(), &opts).map_err(super::in_file(&path))?;
    let write =
        |name: &str, text: &str| crate::files::write_atomic(&args.out.join(name), text.as_bytes());
    write("risk.md", &report.to_markdown())?;
    write("risk.json", &report.to_json())?;
    write("risk.html", &report.to_html())?;
    if args.json {
        print!("{}", report.to_json());
    } else {
        print!("{}", report.to_markdown());
        println!(
            "\nreport: {} (.json, .html); reproducers: {} (`nanhunt replay DIR`)",
            args.out.join("risk.md").display(),
            reproducers.display()
        );
    }
    Ok(if report.found() {
        Exit::Found
    } else {
        Exit::Clean
    })
}
