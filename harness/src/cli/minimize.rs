//! `nanhunt minimize CASE.json`: shrink a failing case to a reproducer.

use super::{case_arg, Exit, LimitArgs};
use crate::minimize::{minimize, CaseSize, MinimizeOptions};
use crate::RunOptions;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The failing case.
    /// (Optional in a binary built with `nanhunt::cli::main_with`: its model\'s own case.)
    case: Option<PathBuf>,
    /// Write the reproducer here (default: print it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Training runs the minimizer may spend.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_runs: u64,
    #[command(flatten)]
    limits: LimitArgs,
}

fn size(s: &CaseSize) -> String {
    format!(
        "{} steps, batch {}, {} parameters, {} augmentations, {} pathologies, {} non-default fields",
        s.steps, s.batch_size, s.params, s.augmentations, s.pathologies, s.non_default_fields
    )
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let limits = args.limits.limits();
    let (case, path) = case_arg(args.case.as_deref(), &limits)?;
    if let Some(out) = &args.out {
        // Before the minimization, not after it: a bad --out fails at once.
        crate::files::check_writable(out).map_err(|e| anyhow::Error::from(e).context("--out"))?;
    }
    super::factory_of(&case)?;
    let opts = MinimizeOptions::default()
        .with_max_runs(args.max_runs as usize)
        .with_run(RunOptions::default().with_limits(limits));
    let Some(m) = minimize(&case, None, &opts)? else {
        match &args.out {
            Some(out) => println!(
                "the case trains stably: nothing to minimize, so no reproducer was written to {}",
                out.display()
            ),
            None => println!("the case trains stably: nothing to minimize"),
        }
        return Ok(Exit::Clean);
    };
    let repro = m.reproducer(&case, format!("nanhunt minimize {}", path.display()));
    eprintln!("signature: {}", m.signature);
    eprintln!(
        "runs used: {}{}",
        m.runs,
        if m.fixpoint {
            " (fixpoint)"
        } else {
            " (budget spent)"
        }
    );
    eprintln!("before: {}", size(&m.before));
    eprintln!("after:  {}", size(&m.after));
    if let Some(samples) = &m.samples {
        eprintln!("data:   {samples}");
    }
    match &args.out {
        Some(path) => {
            repro.write(path)?;
            eprintln!("reproducer: {}", path.display());
        }
        None => println!("{}", repro.to_json_in(std::path::Path::new("."))),
    }
    Ok(Exit::Found)
}
