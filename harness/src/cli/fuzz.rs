//! `nanhunt fuzz`: a fuzz campaign over the built-in families, or (in a
//! binary built with `nanhunt::cli::main_with`) around the binary's own model.

use super::Exit;
use crate::campaign::workers::{WorkerLimits, Workers, CHILD_MEMORY_HEADROOM};
use crate::campaign::{
    parse_duration, run_campaign_then, CampaignOptions, Placement, Shard, Summary, REPRO_DIR,
    SUMMARY_FILE,
};
use crate::spec::{DeviceSpec, Limits, FAMILIES};
use crate::strategy::{ModelScale, StrategyOptions};
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
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000_000))]
    runs: Option<u64>,
    /// Parallel workers (one compute thread each).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=super::MAX_THREADS))]
    jobs: u64,
    /// Run each worker's cases in a child process (isolates a case that
    /// aborts or runs out of memory: it is journaled as a crash) or in a
    /// thread of this process.
    #[arg(long, value_enum, default_value_t = WorkerKind::Processes)]
    workers: WorkerKind,
    /// Campaign seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The device: cpu, or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// With --device cuda: train each case on the runner's CPU or the GPU,
    /// wherever cases of its family and size ran faster (speed), or every
    /// case on the GPU (device).
    #[arg(long, value_enum, default_value_t = PlacementKind::Speed)]
    placement: PlacementKind,
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
    /// The scale of the models drawn: small (widths up to 32, batches up
    /// to 16: milliseconds a run) or large (the same draws with widths,
    /// sequences, images and batches ×4, transformer widths ×8: the scale
    /// users train at, for a GPU that small cases cannot keep busy).
    #[arg(long, default_value = "small")]
    size: ModelScale,
    /// Longest generated run, in steps (generated runs take 3 or more).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(3..=100_000))]
    max_steps: u64,
    /// The share of runs that mutate a case this shard found earlier; 0
    /// makes every run a fresh draw, so that shards merge into exactly the
    /// campaign run in one process.
    #[arg(long, default_value_t = crate::journal::DEFAULT_MUTATION_RATE, value_parser = mutation_rate)]
    mutation_rate: f64,
    /// Training runs each minimization may spend.
    #[arg(long, default_value_t = 150, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    minimize_runs: u64,
    /// A run that takes longer is killed and journaled as a `timeout`
    /// (process workers): 90s, 15m.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    case_timeout: Duration,
    /// Reject generated cases whose estimated memory exceeds this many MiB;
    /// each worker process gets this plus 1 GiB of address space.
    #[arg(long, default_value_t = (Limits::default().max_memory_bytes >> 20) as u64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    max_memory_mib: u64,
    /// Train every case on this dataset (.safetensors, .npy, .npz, .csv):
    /// models are fitted to its samples and classes, every other knob is fuzzed.
    #[arg(long)]
    data: Option<PathBuf>,
    /// The dataset's inputs tensor or array.
    #[arg(long, default_value = "inputs", requires = "data")]
    data_inputs: String,
    /// The dataset's labels (tensor, array, .npy beside it, or CSV column).
    #[arg(long, default_value = "labels", requires = "data")]
    data_labels: String,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn mutation_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("`{text}` is not a share between 0 and 1")),
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PlacementKind {
    Speed,
    Device,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum WorkerKind {
    Processes,
    Threads,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    if args.resume && !args.out.join(crate::journal::JOURNAL_FILE).exists() {
        eprintln!(
            "note: {} holds no campaign journal to resume (deleted, or never written): a new campaign starts there",
            args.out.display()
        );
    }
    if !args.resume && args.out.join(crate::journal::JOURNAL_FILE).exists() {
        anyhow::bail!(
            "{} holds a campaign journal: pass --resume to continue it, or choose another --out",
            args.out.display()
        );
    }
    if args.case_timeout.is_zero() {
        anyhow::bail!("--case-timeout: must be longer than 0 s");
    }
    let limits = Limits::default().max_memory_bytes((args.max_memory_mib << 20) as usize);
    let dataset = match &args.data {
        Some(path) => {
            // Workers and reproducers find the file wherever they run.
            let path = std::path::absolute(path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let mut source = crate::spec::FileSource::new(&path);
            source.inputs = args.data_inputs.clone();
            source.labels = Some(args.data_labels.clone());
            let fit = crate::strategy::DatasetFit::of(&source, limits.max_memory_bytes)
                .map_err(super::in_file(&path))?;
            Some(fit)
        }
        None => None,
    };
    let families: Vec<String> = if !args.family.is_empty() {
        args.family.clone()
    } else {
        FAMILIES.iter().map(|f| f.to_string()).collect()
    };
    // Without --family, a dataset keeps the families that can read it.
    let families = match &dataset {
        Some(fit) if args.family.is_empty() => {
            families.into_iter().filter(|f| fit.fits(f)).collect()
        }
        _ => families,
    };
    let runs = match (args.budget, args.runs) {
        (None, None) => Some(100),
        (_, r) => r,
    };
    let mut strategy = StrategyOptions::default();
    // A binary with its own model fuzzes it, unless told a family or a dataset.
    let own = crate::models::registered().filter(|_| args.family.is_empty() && args.data.is_none());
    let families = match own {
        Some(m) => vec![m.name().to_string()],
        None => families,
    };
    strategy.base = own.map(|m| m.case.clone());
    strategy.families = families;
    strategy.clean_data = args.clean_data;
    strategy.safe_envelope = false;
    strategy.max_steps = args.max_steps as usize;
    strategy.dataset = dataset;
    strategy.scale = args.size;
    let mut opts = CampaignOptions::default();
    opts.strategy = strategy;
    opts.budget = args.budget;
    opts.runs = runs;
    opts.jobs = args.jobs as usize;
    opts.seed = args.seed;
    opts.device = args.device;
    opts.placement = match args.placement {
        PlacementKind::Speed => Placement::Speed,
        PlacementKind::Device => Placement::Device,
    };
    opts.out = args.out.clone();
    opts.resume = args.resume;
    opts.shard = args.shard;
    opts.minimize_runs = args.minimize_runs as usize;
    opts.mutation_rate = args.mutation_rate;
    opts.progress = super::progress::Bar::unless(args.quiet, "runs");
    opts.workers = match args.workers {
        WorkerKind::Threads => Workers::Threads,
        WorkerKind::Processes => Workers::Processes {
            exe: std::env::current_exe().map_err(|e| {
                anyhow::anyhow!("cannot find the nanhunt executable for worker processes: {e}")
            })?,
        },
    };
    opts.limits = WorkerLimits {
        // CUDA reserves far more address space than it uses: an
        // address-space limit would stop it from starting at all.
        memory_bytes: (args.device == DeviceSpec::Cpu)
            .then_some(limits.max_memory_bytes as u64 + CHILD_MEMORY_HEADROOM),
        case: limits,
        case_timeout: args.case_timeout,
    };
    // The summary is out before the journal says it was reported.
    let summary = run_campaign_then(&opts, |s| {
        print_summary(s, &args.out);
        let _ = std::io::Write::flush(&mut std::io::stdout());
    })?;
    Ok(if summary.new_signatures.is_empty() {
        Exit::Clean
    } else {
        Exit::Found
    })
}

pub fn print_summary(s: &Summary, out: &std::path::Path) {
    println!(
        "{} runs ({} this session, {:.1} runs/s): {} stable, {} unstable, {} errors, {} timed out",
        s.runs, s.runs_this_session, s.runs_per_s, s.stable, s.unstable, s.errors, s.timeouts
    );
    if !s.runs_by_device.is_empty() {
        let on: Vec<String> = s
            .runs_by_device
            .iter()
            .map(|(d, n)| format!("{n} on {d}"))
            .collect();
        println!("placed by measured speed: {}", on.join(", "));
    }
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
        let repro = match (&sig.reproducer, &sig.unminimized) {
            (Some(file), _) => format!("{REPRO_DIR}/{file}"),
            (None, Some(why)) => format!("(not minimized: {why})"),
            (None, None) => "(not minimized yet: resume the campaign)".into(),
        };
        println!(
            "  {:5} x {}{new}\n          {repro}",
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
