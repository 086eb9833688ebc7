//! `nanhunt minimize CASE.json`: shrink a failing case to a reproducer.

use super::{load_case, Exit, LimitArgs};
use nanhunt::minimize::{minimize, CaseSize, MinimizeOptions};
use nanhunt::models::BuiltinFactory;
use nanhunt::RunOptions;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The failing case.
    case: PathBuf,
    /// Write the reproducer here (default: print it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Training runs the minimizer may spend.
    #[arg(long, default_value_t = 300)]
    max_runs: usize,
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
    let case = load_case(&args.case, &limits)?;
    if BuiltinFactory::new(&case.model).is_none() {
        anyhow::bail!(
            "{}: a custom model is minimized through the library",
            args.case.display()
        );
    }
    let opts = MinimizeOptions {
        max_runs: args.max_runs,
        run: RunOptions {
            limits,
            ..RunOptions::default()
        },
    };
    let Some(m) = minimize(&case, None, &opts)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.case.display()))?
    else {
        println!("the case trains stably: nothing to minimize");
        return Ok(Exit::Clean);
    };
    let repro = m.reproducer(&case, format!("nanhunt minimize {}", args.case.display()));
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
    match &args.out {
        Some(path) => {
            nanhunt::campaign::write_atomic(path, &repro.to_json())
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            eprintln!("reproducer: {}", path.display());
        }
        None => println!("{}", repro.to_json()),
    }
    Ok(Exit::Found)
}
