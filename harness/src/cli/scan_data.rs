//! `nanhunt scan-data FILE`: the article's data sanity check over a whole
//! dataset file, streamed; exit 1 when it finds a problem that breaks
//! training (warnings alone exit 0).

use super::Exit;
use crate::data::scan::{scan_file, ScanOptions};
use crate::spec::{FileFormat, FileSource};
use std::path::PathBuf;

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Md,
    Json,
}

#[derive(clap::Args)]
pub struct Args {
    /// The dataset: .safetensors, .npy, .npz or .csv.
    file: PathBuf,
    /// The inputs tensor (safetensors) or array (npz).
    #[arg(long, default_value = "inputs")]
    inputs: String,
    /// The labels: a tensor, an array, a .npy file beside FILE, or a CSV
    /// column [default: labels; where the file has none, its inputs are
    /// scanned alone].
    #[arg(long)]
    labels: Option<String>,
    /// The file has no labels (give --targets instead).
    #[arg(long, conflicts_with = "labels")]
    no_labels: bool,
    /// Dense targets (tensor or array), for regression datasets.
    #[arg(long)]
    targets: Option<String>,
    /// Read the file as this format instead of by its extension.
    #[arg(long, value_enum)]
    format: Option<DataFormat>,
    /// Labels must lie in 0..CLASSES (without it, only negative labels are flagged).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    classes: Option<u64>,
    /// Finite values beyond this magnitude are extreme.
    #[arg(long, default_value_t = 1e6)]
    extreme: f64,
    /// Sample indices listed per problem (all are counted).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1 << 32))]
    max_listed: u64,
    /// Memory the scan may hold, in MiB: it sizes the chunk read at a time,
    /// the quantile sample and the duplicate table (exact up to about 7k
    /// samples per MiB, estimated past it, with the error stated).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(8..=1 << 20))]
    max_memory_mib: u64,
    /// Threads that scan the file (all cores by default); the report is the
    /// same for any number.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=super::MAX_THREADS))]
    threads: Option<u64>,
    #[arg(long, value_enum, default_value = "md")]
    report: Format,
    /// Write the report here instead of printing it.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DataFormat {
    Safetensors,
    Npy,
    Npz,
    Csv,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    if !(args.extreme.is_finite() && args.extreme > 0.0) {
        anyhow::bail!(
            "--extreme must be a positive finite number, got {}",
            args.extreme
        );
    }
    if let Some(out) = &args.out {
        crate::files::check_writable(out)?;
    }
    let mut source = FileSource::new(&args.file);
    source.inputs = args.inputs;
    let implicit = args.labels.is_none() && !args.no_labels;
    source.labels = match args.no_labels {
        true => None,
        false => Some(args.labels.unwrap_or_else(|| "labels".into())),
    };
    source.targets = args.targets;
    source.format = args.format.map(|f| match f {
        DataFormat::Safetensors => FileFormat::Safetensors,
        DataFormat::Npy => FileFormat::Npy,
        DataFormat::Npz => FileFormat::Npz,
        DataFormat::Csv => FileFormat::Csv,
    });
    let mut opts = ScanOptions::default();
    opts.classes = args.classes.map(|c| c as usize);
    opts.extreme = args.extreme;
    opts.max_listed = args.max_listed as usize;
    opts.max_memory = (args.max_memory_mib as usize) << 20;
    opts.threads = match args.threads {
        Some(n) => n as usize,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let scan = match scan_file(&source, &opts) {
        // No labels of the default name: the inputs alone are scanned.
        Err(e) if implicit => {
            let alone = FileSource {
                labels: None,
                ..source.clone()
            };
            match scan_file(&alone, &opts) {
                Ok(scan) => {
                    eprintln!(
                        "note: {}: no labels found ({e}); its inputs are scanned alone (--labels NAME names them)",
                        args.file.display()
                    );
                    Ok(scan)
                }
                Err(_) => Err(e),
            }
        }
        scanned => scanned,
    }
    .map_err(as_option)
    .map_err(super::in_file(&args.file))?;
    // Nothing scanned is no clean bill: training would refuse it too.
    if scan.samples == 0 {
        return Err(crate::error::Error::malformed(
            crate::error::Document::Dataset,
            &args.file,
            "it holds no samples: there is nothing to scan",
        )
        .into());
    }
    let text = match args.report {
        Format::Md => scan.to_markdown(),
        Format::Json => scan.to_json() + "\n",
    };
    match &args.out {
        Some(path) => crate::files::write_atomic(path, text.as_bytes())?,
        None => print!("{text}"),
    }
    Ok(if scan.has_errors() {
        Exit::Found
    } else {
        Exit::Clean
    })
}

/// The source's fields are this command's options: an error in one names
/// the option (`--format`), not a case field no case file holds.
fn as_option(e: crate::Error) -> crate::Error {
    match e {
        crate::Error::InvalidCase { field, reason } => match field.strip_prefix("data.source.") {
            Some(option) => crate::Error::option(option, reason),
            None => crate::Error::InvalidCase { field, reason },
        },
        e => e,
    }
}
