//! `nanhunt replay PATH`: does a dump or a reproducer still fail the same way?

use super::Exit;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A crash dump directory (`run --dump`) or a reproducer file.
    path: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    if !args.path.exists() {
        anyhow::bail!(
            "{}: no such scene or reproducer (`run --dump DIR` writes a scene only when the run fails; add `--dump-at STEP` for the scene of a step that does not; `minimize` writes a reproducer only for a case that fails)",
            args.path.display()
        );
    }
    let report = crate::replay::replay(&args.path, None, &crate::RunOptions::default())
        .map_err(super::in_file(&args.path))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.message);
        match report.bit_identical {
            Some(true) => {
                println!("  the step's loss is bit-identical to the recorded one")
            }
            Some(false) => println!("  the step's loss differs from the recorded one"),
            None => {}
        }
    }
    Ok(if report.reproduced() {
        Exit::Clean
    } else {
        Exit::Found
    })
}
