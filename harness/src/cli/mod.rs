//! Subcommands, one file each. Raw flags are parsed by clap, turned into
//! library calls, and every outcome maps to an exit code:
//! 0 stable / nothing found, 1 unstable / findings, 2 usage or I/O error,
//! 3 an internal error (decided from the error's type: [`Exit::of_error`]).

mod diagnose;
mod diff;
mod example;
mod fuzz;
mod gradcheck;
#[cfg(feature = "arbitrary")]
mod import_artifact;
mod inspect;
mod lr_table;
mod merge;
mod minimize;
mod progress;
mod replay;
mod report;
mod run;
mod scan_data;

use clap::{Parser, Subcommand};
use nanhunt::{Case, Limits};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Stable, or nothing found.
    Clean = 0,
    /// Unstable, or something found.
    Found = 1,
    /// Bad input or an I/O failure.
    Error = 2,
    /// nanhunt's own failure (a bug, a candle error): not the input's fault.
    Internal = 3,
}

impl Exit {
    /// The exit code of a failed command, from the type of its error.
    pub fn of_error(e: &anyhow::Error) -> Exit {
        if is_internal(e) {
            Exit::Internal
        } else {
            Exit::Error
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e as u8)
    }
}

#[derive(Parser)]
#[command(
    name = "nanhunt",
    version,
    about = "Find, localize and reproduce NaN/Inf and divergence in neural-network training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a fuzz campaign: find, dedup and minimize instabilities; exit 1 when something new was found.
    Fuzz(fuzz::Args),
    /// Merge the output directories of campaign shards.
    Merge(merge::Args),
    /// Shrink a failing case while its signature holds; prints or writes the reproducer.
    Minimize(minimize::Args),
    /// Print the built-in default case of a model family.
    Example(example::Args),
    /// Run a case and report whether training stayed stable.
    Run(run::Args),
    /// Check the case's gradients against finite differences (in f64).
    Gradcheck(gradcheck::Args),
    /// The five-step diagnosis: reproduce, check data, gradients, loss and hardware; verified fixes.
    Diagnose(diagnose::Args),
    /// Render a campaign's stability report (Markdown, JSON or self-contained HTML).
    Report(report::Args),
    /// Turn a libFuzzer crash artifact of a `fuzz/` target into a case and, for training targets, a minimized reproducer.
    #[cfg(feature = "arbitrary")]
    ImportArtifact(import_artifact::Args),
    /// Run a case on several devices, precisions or thread counts and report the first step where they disagree.
    Diff(diff::Args),
    /// Measure the learning rates at which each model family diverges and goes NaN, with a curvature prediction.
    LrTable(lr_table::Args),
    /// Re-run a crash dump's failing step, or a reproducer; exit 0 when it fails the same way.
    Replay(replay::Args),
    /// Print a dump's scene (a guard's or a case run's): finding, losses, statistics, environment.
    Inspect(inspect::Args),
    /// Check a whole dataset file (streamed): NaN/Inf/extreme values, bad labels, constant features, zero and duplicated samples; exit 1 on a problem.
    ScanData(scan_data::Args),
    /// A campaign's worker process: JSON requests on stdin, responses on stdout.
    #[command(hide = true)]
    Worker,
}

pub fn main() -> anyhow::Result<Exit> {
    let cli = Cli::parse();
    match cli.command {
        Command::Example(a) => example::main(a),
        Command::Fuzz(a) => fuzz::main(a),
        Command::Worker => {
            nanhunt::workers::serve(std::io::stdin().lock(), std::io::stdout().lock())?;
            Ok(Exit::Clean)
        }
        Command::Minimize(a) => minimize::main(a),
        Command::Merge(a) => merge::main(a),
        Command::Run(a) => run::main(a),
        Command::Gradcheck(a) => gradcheck::main(a),
        Command::Replay(a) => replay::main(a),
        Command::Report(a) => report::main(a),
        Command::Diagnose(a) => diagnose::main(a),
        Command::LrTable(a) => lr_table::main(a),
        Command::Diff(a) => diff::main(a),
        Command::ScanData(a) => scan_data::main(a),
        Command::Inspect(a) => inspect::main(a),
        #[cfg(feature = "arbitrary")]
        Command::ImportArtifact(a) => import_artifact::main(a),
    }
}

/// The most worker or compute threads a command starts.
pub const MAX_THREADS: u64 = 1024;

/// Size limits shared by the commands that run cases.
#[derive(clap::Args, Clone, Debug)]
pub struct LimitArgs {
    /// Reject cases with more trainable parameters than this.
    #[arg(long, default_value_t = Limits::default().max_params as u64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    max_params: u64,
    /// Reject cases with more steps than this.
    #[arg(long, default_value_t = Limits::default().max_steps as u64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 32))]
    max_steps: u64,
    /// Reject cases with a larger batch than this.
    #[arg(long, default_value_t = Limits::default().max_batch as u64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    max_batch: u64,
    /// Reject cases whose estimated memory exceeds this many MiB (at most
    /// 16 TiB); campaign worker processes are also held to it.
    #[arg(long, default_value_t = (Limits::default().max_memory_bytes >> 20) as u64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    max_memory_mib: u64,
}

impl LimitArgs {
    pub fn limits(&self) -> Limits {
        // The ranges above keep every value and the byte count within usize.
        Limits::default()
            .max_params(self.max_params as usize)
            .max_steps(self.max_steps as usize)
            .max_batch(self.max_batch as usize)
            .max_memory_bytes((self.max_memory_mib << 20) as usize)
    }
}

/// Loads and validates a case file; errors name the file once.
pub fn load_case(path: &Path, limits: &Limits) -> anyhow::Result<Case> {
    Case::load_with_limits(path, limits).map_err(|e| match e {
        nanhunt::Error::Io { .. } | nanhunt::Error::Malformed { .. } => anyhow::Error::from(e),
        e => anyhow::Error::from(e).context(format!("case {}", path.display())),
    })
}

/// Names `path` in an error about it, unless the error already does; the
/// library error stays inside (see [`is_internal`]).
pub fn in_file(path: &Path) -> impl FnOnce(nanhunt::Error) -> anyhow::Error + '_ {
    move |e| match e {
        nanhunt::Error::Io { .. } | nanhunt::Error::Malformed { .. } => anyhow::Error::from(e),
        e => anyhow::Error::from(e).context(path.display().to_string()),
    }
}

/// Whether an error is nanhunt's own failure rather than the input's: a
/// library error that is not about the input (a candle error, a worker
/// that answered nonsense). Bad flags, cases and files are input errors.
pub fn is_internal(e: &anyhow::Error) -> bool {
    e.chain()
        .find_map(|c| c.downcast_ref::<nanhunt::Error>())
        .is_some_and(|e| !e.is_input_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_errors_and_internal_errors_are_told_apart() {
        let candle = nanhunt::Error::Candle(candle_core::Error::Msg("matmul shapes".into()));
        assert!(is_internal(&in_file(Path::new("case.json"))(candle)));
        let invalid = nanhunt::Error::invalid("steps", "must be at least 1");
        let e = in_file(Path::new("case.json"))(invalid);
        assert!(!is_internal(&e));
        assert_eq!(
            format!("{e:#}"),
            "case.json: invalid case: field `steps`: must be at least 1"
        );
        assert!(!is_internal(&anyhow::anyhow!("--jobs must be at least 1")));
        assert_eq!(Exit::of_error(&e), Exit::Error);
        let candle = nanhunt::Error::Candle(candle_core::Error::Msg("shapes".into()));
        assert_eq!(Exit::of_error(&anyhow::Error::from(candle)), Exit::Internal);
        // An error that names its file is not prefixed with it again.
        let io = nanhunt::Error::io("case.json", std::io::ErrorKind::NotFound.into());
        let e = in_file(Path::new("case.json"))(io);
        assert_eq!(format!("{e:#}").matches("case.json").count(), 1, "{e:#}");
    }
}
