//! `nanhunt report DIR`: the stability report of a campaign directory.

use super::Exit;
use crate::report::StabilityReport;
use std::path::PathBuf;

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Md,
    Json,
    Html,
}

#[derive(clap::Args)]
pub struct Args {
    /// A campaign directory (`fuzz --out`, or `merge --out`).
    dir: PathBuf,
    #[arg(long, value_enum, default_value = "md")]
    format: Format,
    /// Write here instead of printing.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let journal = args.dir.join(crate::journal::JOURNAL_FILE);
    if !journal.exists() {
        let d = args.dir.display();
        match args.dir.is_dir() {
            false => anyhow::bail!("{d}: no campaign directory there (was it deleted?)"),
            true if args.dir.join(crate::campaign::REPRO_DIR).is_dir() => anyhow::bail!(
                "{d} holds a campaign's reproducers but no journal: the journal was deleted (a campaign whose directory is deleted under it stops); each file in repro/ still replays"
            ),
            true => anyhow::bail!("{d} holds no campaign journal (`fuzz --out` writes one)"),
        }
    }
    let report = StabilityReport::from_dir(&args.dir).map_err(super::in_file(&args.dir))?;
    let text = match args.format {
        Format::Md => report.to_markdown(),
        Format::Json => report.to_json(),
        Format::Html => report.to_html(),
    };
    match &args.out {
        Some(path) => crate::files::write_atomic(path, text.as_bytes())?,
        None => print!("{text}"),
    }
    Ok(Exit::Clean)
}
