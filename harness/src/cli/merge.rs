//! `nanhunt merge DIR... --out DIR`: combine campaign shards.

use super::Exit;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Output directories of the shards (`fuzz --out`).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Where the merged campaign goes.
    #[arg(long)]
    out: PathBuf,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let summary = crate::merge::merge(&args.inputs, &args.out)?;
    super::fuzz::print_summary(&summary, &args.out);
    Ok(if summary.signatures.is_empty() {
        Exit::Clean
    } else {
        Exit::Found
    })
}
