//! `nanhunt lr-table`: measured (and curvature-predicted) learning-rate
//! thresholds per model family, as Markdown, CSV or JSON.

use super::{case_arg, Exit, LimitArgs};
use crate::files::write_atomic;
use crate::lrtable::{measure, Config, LrTable, LrTableOptions, DEFAULT_OPTIMIZERS, OPTIMIZERS};
use crate::spec::{DeviceSpec, Precision, Size, FAMILIES};
use crate::RunOptions;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Md,
    Csv,
    Json,
}

#[derive(clap::Args)]
pub struct Args {
    /// Built-in families (repeat or comma-separate); all by default.
    #[arg(long, value_delimiter = ',', value_parser = FAMILIES, conflicts_with = "case")]
    family: Vec<String>,
    /// Model sizes: small, default, large (the side-by-side benchmark's).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "default",
        conflicts_with = "case"
    )]
    size: Vec<Size>,
    /// Measure this case's model, data and loss instead of a built-in family.
    #[arg(long)]
    case: Option<PathBuf>,
    /// Optimizers: sgd, momentum (SGD, 0.9), adam, adamw, rmsprop.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_OPTIMIZERS, value_parser = OPTIMIZERS)]
    optimizer: Vec<String>,
    /// Precisions: f32, f64, f16, bf16, mixed_f16, mixed_bf16.
    #[arg(long, value_delimiter = ',', default_value = "f32")]
    precision: Vec<Precision>,
    /// Seeds per configuration (weights and data).
    #[arg(long, default_value_t = LrTableOptions::default().seeds as u64,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    seeds: u64,
    /// Training steps per run.
    #[arg(long, default_value_t = LrTableOptions::default().steps as u64,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    steps: u64,
    /// Bisection tolerance (and grid step), in decades of LR.
    #[arg(long, default_value_t = LrTableOptions::default().tolerance)]
    tolerance: f64,
    /// Lowest and highest LR the search may try.
    #[arg(long, default_value_t = LrTableOptions::default().min_lr)]
    min_lr: f64,
    #[arg(long, default_value_t = LrTableOptions::default().max_lr)]
    max_lr: f64,
    /// Train every step on the same batch (full-batch gradient descent).
    #[arg(long)]
    full_batch: bool,
    /// Skip the curvature prediction.
    #[arg(long)]
    no_curvature: bool,
    /// Parallel workers, one compute thread each (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=super::MAX_THREADS))]
    jobs: Option<u64>,
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    #[arg(long, value_enum, default_value_t = Format::Md)]
    format: Format,
    /// Write the table here (atomically) instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    limits: LimitArgs,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let limits = args.limits.limits();
    let jobs = match args.jobs {
        Some(j) => j as usize,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // A binary with its own model measures that model unless told a family.
    let own = args.family.is_empty() && crate::models::registered().is_some();
    let configs = match (&args.case, own) {
        (Some(_), _) | (None, true) => {
            let (base, _) = case_arg(args.case.as_deref(), &limits)?;
            let family = base.family().to_string();
            let mut out = Vec::new();
            for name in &args.optimizer {
                for precision in &args.precision {
                    let mut case = base.clone();
                    case.optimizer = crate::lrtable::optimizer_named(name)
                        .expect("clap checked the optimizer name");
                    case.precision = precision.clone();
                    out.push(Config {
                        family: family.clone(),
                        size: "case".into(),
                        optimizer: name.clone(),
                        case,
                    });
                }
            }
            out
        }
        (None, false) => {
            let families: Vec<String> = if args.family.is_empty() {
                FAMILIES.iter().map(|f| f.to_string()).collect()
            } else {
                args.family.clone()
            };
            Config::builtin(&families, &args.size, &args.optimizer, &args.precision)?
        }
    };
    let mut opts = LrTableOptions::default();
    // The default start, moved inside a narrower --min-lr/--max-lr.
    let inside = |x: f64| x.max(args.min_lr).min(args.max_lr);
    let (lo, hi) = opts.start;
    opts.start = if inside(lo) < inside(hi) {
        (inside(lo), inside(hi))
    } else {
        (args.min_lr, args.max_lr)
    };
    opts.seeds = args.seeds as usize;
    opts.steps = args.steps as usize;
    opts.tolerance = args.tolerance;
    opts.min_lr = args.min_lr;
    opts.max_lr = args.max_lr;
    opts.full_batch = args.full_batch;
    opts.curvature = !args.no_curvature;
    opts.jobs = jobs;
    opts.progress = super::progress::Bar::unless(args.quiet, "seeds");
    opts.run = RunOptions::default().with_limits(limits).on(args.device);
    let table = measure(&configs, None, &opts)?;
    let text = render(&table, args.format);
    match &args.out {
        Some(path) => {
            write_atomic(path, text.as_bytes())?;
            eprintln!("{} configurations: {}", table.rows.len(), path.display());
        }
        None => print!("{text}"),
    }
    Ok(Exit::Clean)
}

fn render(table: &LrTable, format: Format) -> String {
    match format {
        Format::Md => table.to_markdown(),
        Format::Csv => table.to_csv(),
        Format::Json => table.to_json(),
    }
}
