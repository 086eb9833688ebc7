//! `nanhunt fuzz`: a fuzz campaign over the built-in families.

use super::Exit;
use nanhunt::campaign::{
    parse_duration, run_campaign, CampaignOptions, Shard, Summary, REPRO_DIR, SUMMARY_FILE,
};
use nanhunt::spec::{DeviceSpec, FAMILIES};
use nanhunt::strategy::StrategyOptions;
use nanhunt::workers::Workers;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Families to fuzz (repeat or comma-separate); all by default.
    #[arg(long, value_delimiter = ',', value_parser = FAMILIES)]
    family: Vec<String>,
    /// Stop after this long: 90s, 15m, 2h, 1h30m.
    #[arg(long, value_parser = parse_duration)]
    budget: Option<Duration>,
    /// Stop after this many runs of this shard (resumed runs count); 100 when
    /// neither --runs nor --budget is given.
    #[arg(long)]
    runs: Option<u64>,
    /// Parallel workers (one compute thread each).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Run each worker's cases in a child process (isolates a case that
    /// aborts or runs out of memory: it is journaled as a crash) or in a
    /// thread of this process.
    #[arg(long, value_enum, default_value_t = WorkerKind::Processes)]
    workers: WorkerKind,
    /// Campaign seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Output directory: journal.jsonl, repro/, summary.json.
    #[arg(long, default_value = "nanhunt-out")]
    out: PathBuf,
    /// Continue the campaign journaled in --out.
    #[arg(long)]
    resume: bool,
    /// Run shard I of N (indices I, I+N, I+2N, ...); merge shards with `nanhunt merge`.
    #[arg(long, default_value = "0/1")]
    shard: Shard,
    /// Only clean data: no injected pathologies (natural instabilities only).
    #[arg(long)]
    clean_data: bool,
    /// Longest generated run, in steps.
    #[arg(long, default_value_t = 30)]
    max_steps: usize,
    /// Training runs each minimization may spend.
    #[arg(long, default_value_t = 150)]
    minimize_runs: usize,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum WorkerKind {
    Processes,
    Threads,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    if args.jobs == 0 {
        anyhow::bail!("--jobs must be at least 1");
    }
    let families = if args.family.is_empty() {
        FAMILIES.iter().map(|f| f.to_string()).collect()
    } else {
        args.family.clone()
    };
    let runs = match (args.budget, args.runs) {
        (None, None) => Some(100),
        (_, r) => r,
    };
    let opts = CampaignOptions {
        strategy: StrategyOptions {
            families,
            clean_data: args.clean_data,
            safe_envelope: false,
            max_steps: args.max_steps,
        },
        budget: args.budget,
        runs,
        jobs: args.jobs,
        seed: args.seed,
        device: args.device,
        out: args.out.clone(),
        resume: args.resume,
        shard: args.shard,
        minimize_runs: args.minimize_runs,
        progress: !args.quiet,
        workers: match args.workers {
            WorkerKind::Threads => Workers::Threads,
            WorkerKind::Processes => Workers::Processes {
                exe: std::env::current_exe().map_err(|e| {
                    anyhow::anyhow!("cannot find the nanhunt executable for worker processes: {e}")
                })?,
            },
        },
    };
    let summary = run_campaign(&opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    print_summary(&summary, &args.out);
    Ok(if summary.new_signatures.is_empty() {
        Exit::Clean
    } else {
        Exit::Found
    })
}

pub fn print_summary(s: &Summary, out: &std::path::Path) {
    println!(
        "{} runs ({} this session, {:.1} runs/s): {} stable, {} unstable, {} errors",
        s.runs, s.runs_this_session, s.runs_per_s, s.stable, s.unstable, s.errors
    );
    println!(
        "{} distinct signatures ({} new):",
        s.signatures.len(),
        s.new_signatures.len()
    );
    for sig in &s.signatures {
        let new = if s.new_signatures.contains(&sig.slug) {
            " [new]"
        } else {
            ""
        };
        let repro = sig.reproducer.as_deref().unwrap_or("(not minimized)");
        println!(
            "  {:5} x {}{new}\n          {REPRO_DIR}/{repro}",
            sig.count, sig.signature
        );
    }
    println!("reproducers: {}", out.join(REPRO_DIR).display());
    println!("summary: {}", out.join(SUMMARY_FILE).display());
    println!(
        "report: {} (also .md and .json)",
        out.join("report.html").display()
    );
}
