//! Subcommands, one file each. Raw flags are parsed by clap, turned into
//! library calls, and every outcome maps to an exit code:
//! 0 stable / nothing found, 1 unstable / findings, 2 usage or I/O error,
//! 3 an internal error (decided from the error's type: [`Exit::of_error`]).

// The commands fill in options as users' code does: from `default()`, a
// field at a time (the option structs are `#[non_exhaustive]`).
#![allow(clippy::field_reassign_with_default)]

mod diagnose;
mod diff;
mod example;
mod fuzz;
mod gradcheck;
mod hunt;
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

use crate::{Case, Limits};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};

/// The command line's exit codes.
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
    /// Search inputs and a drift of the weights that fire the model's latent NaNs; write the risk report and reproducers; exit 1 on a trigger.
    Hunt(hunt::Args),
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

/// The `nanhunt` command line over the built-in families (the nanhunt
/// binary's `main`): parses the arguments, runs the subcommand, prints an
/// error's whole chain, and maps the result to the exit code.
pub fn main() -> std::process::ExitCode {
    exit_code(run(Cli::parse()))
}

/// The whole command line in a user's own binary or example, every
/// subcommand over the user's model: `fn main() { nanhunt::cli::main_with(model) }`.
/// Commands that take a case run the model's own case when none is given
/// (`cargo run --example my_model -- fuzz --runs 200`, `-- hunt`, `-- run`);
/// a campaign's worker processes are this binary again, so they build the
/// same model. Exits the process with the command's exit code.
pub fn main_with(model: crate::models::UserModel) -> ! {
    let code = match crate::models::register(model) {
        Ok(_) => run(Cli::parse()),
        Err(e) => Err(anyhow::Error::from(e).context("the binary's model")),
    };
    let code = match code {
        Ok(exit) => exit,
        Err(e) => report_error(&e),
    };
    std::process::exit(code as i32)
}

/// The exit code of a command's result, its error printed.
fn exit_code(result: anyhow::Result<Exit>) -> std::process::ExitCode {
    match result {
        Ok(code) => code.into(),
        Err(e) => report_error(&e).into(),
    }
}

/// Prints an error's chain; its exit code.
fn report_error(e: &anyhow::Error) -> Exit {
    eprintln!("error: {}", chain_text(e));
    let exit = Exit::of_error(e);
    if exit == Exit::Internal {
        eprintln!("(an internal error, not bad input: please report it with the case)");
    }
    exit
}

/// An error's chain as one line, `context: cause: cause`, leaving out a
/// cause its parent's message already ends with (an I/O error quotes its
/// source, which the chain would repeat).
pub(crate) fn chain_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Rust ignores SIGPIPE, so `nanhunt fuzz | head` would panic on the closed
/// pipe; with the default action the process ends quietly, like other tools.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_DFL at startup, before
    // any thread exists, has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli) -> anyhow::Result<Exit> {
    restore_sigpipe();
    crate::device::retain_freed_memory();
    match cli.command {
        Command::Example(a) => example::main(a),
        Command::Fuzz(a) => fuzz::main(a),
        Command::Worker => {
            crate::campaign::workers::serve(std::io::stdin().lock(), std::io::stdout().lock())?;
            Ok(Exit::Clean)
        }
        Command::Minimize(a) => minimize::main(a),
        Command::Merge(a) => merge::main(a),
        Command::Run(a) => run::main(a),
        Command::Gradcheck(a) => gradcheck::main(a),
        Command::Hunt(a) => hunt::main(a),
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
pub(crate) const MAX_THREADS: u64 = 1024;

/// Size limits shared by the commands that run cases.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct LimitArgs {
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

/// The case a command runs: the file given, else the registered model's own
/// case (`main_with`); with it, the path its errors name (the file, or the
/// model's name).
pub(crate) fn case_arg(path: Option<&Path>, limits: &Limits) -> anyhow::Result<(Case, PathBuf)> {
    if let Some(path) = path {
        return Ok((load_case(path, limits)?, path.to_path_buf()));
    }
    let Some(model) = crate::models::registered() else {
        anyhow::bail!(
            "a case file is needed (CASE.json; a binary built with nanhunt::cli::main_with runs its model's own case)"
        );
    };
    let name = PathBuf::from(format!("the {} model's case", model.name()));
    model
        .case
        .validate(limits)
        .map_err(|e| anyhow::Error::from(e).context(name.display().to_string()))?;
    Ok((model.case.clone(), name))
}

/// The factory of a case: its built-in family's, or the registered
/// model's; another custom model is an error naming the case.
pub(crate) fn factory_of(case: &Case) -> anyhow::Result<CaseFactory> {
    match crate::models::BuiltinFactory::new(&case.model) {
        Some(b) => Ok(CaseFactory::Builtin(b)),
        None => match crate::models::registered_for(case) {
            Some(m) => Ok(CaseFactory::Registered(m)),
            None => anyhow::bail!(
                "`{}` is a custom model: run it through the library with its factory, or through a binary built with nanhunt::cli::main_with",
                case.family()
            ),
        },
    }
}

/// A case's factory as the commands hold it.
pub(crate) enum CaseFactory {
    Builtin(crate::models::BuiltinFactory),
    Registered(&'static crate::models::UserModel),
}

impl CaseFactory {
    pub fn get(&self) -> &dyn crate::models::ModelFactory {
        match self {
            CaseFactory::Builtin(b) => b,
            CaseFactory::Registered(m) => &*m.factory,
        }
    }
}

/// Loads and validates a case file, or the case of a reproducer file (what
/// `minimize` and campaigns write); errors name the file once.
pub(crate) fn load_case(path: &Path, limits: &Limits) -> anyhow::Result<Case> {
    let load = || -> crate::Result<Case> {
        if !is_reproducer(path) {
            return Case::load_with_limits(path, limits);
        }
        let case = crate::repro::Reproducer::load(path)?.case;
        case.validate(limits)?;
        Ok(case)
    };
    load().map_err(|e| match e {
        crate::Error::Io { .. } | crate::Error::Malformed { .. } => anyhow::Error::from(e),
        e => anyhow::Error::from(e).context(format!("case {}", path.display())),
    })
}

/// The case a reproducer file was minimized from (its provenance), when
/// it records one that is valid here.
pub(crate) fn minimized_from(path: &Path, limits: &Limits) -> Option<Case> {
    if !is_reproducer(path) {
        return None;
    }
    let original = crate::repro::Reproducer::load(path)
        .ok()?
        .provenance
        .original?;
    original.validate(limits).ok()?;
    Some(original)
}

/// Whether a JSON file is a reproducer (a case with the outcome it must keep).
fn is_reproducer(path: &Path) -> bool {
    let Ok(text) = crate::files::read_text(path) else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(&text)
        .is_ok_and(|v| v.get("case").is_some() && v.get("expected").is_some())
}

/// Names `path` in an error about it, unless the error already does; the
/// library error stays inside (see [`is_internal`]).
pub(crate) fn in_file(path: &Path) -> impl FnOnce(crate::Error) -> anyhow::Error + '_ {
    move |e| match e {
        crate::Error::Io { .. } | crate::Error::Malformed { .. } => anyhow::Error::from(e),
        // An error that names the file already is not prefixed with it again.
        e if e.to_string().contains(&path.display().to_string()) => anyhow::Error::from(e),
        e => anyhow::Error::from(e).context(path.display().to_string()),
    }
}

/// Whether an error is nanhunt's own failure rather than the input's: a
/// library error that is not about the input (a candle error, a worker
/// that answered nonsense). Bad flags, cases and files are input errors.
pub(crate) fn is_internal(e: &anyhow::Error) -> bool {
    e.chain()
        .find_map(|c| c.downcast_ref::<crate::Error>())
        .is_some_and(|e| !e.is_input_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_errors_and_internal_errors_are_told_apart() {
        let candle = crate::Error::Candle(candle_core::Error::Msg("matmul shapes".into()));
        assert!(is_internal(&in_file(Path::new("case.json"))(candle)));
        let invalid = crate::Error::invalid("steps", "must be at least 1");
        let e = in_file(Path::new("case.json"))(invalid);
        assert!(!is_internal(&e));
        assert_eq!(
            format!("{e:#}"),
            "case.json: invalid case: field `steps`: must be at least 1"
        );
        assert!(!is_internal(&anyhow::anyhow!("--jobs must be at least 1")));
        assert_eq!(Exit::of_error(&e), Exit::Error);
        let candle = crate::Error::Candle(candle_core::Error::Msg("shapes".into()));
        assert_eq!(Exit::of_error(&anyhow::Error::from(candle)), Exit::Internal);
        // An error that names its file is not prefixed with it again.
        let io = crate::Error::io("case.json", std::io::ErrorKind::NotFound.into());
        let e = in_file(Path::new("case.json"))(io);
        assert_eq!(format!("{e:#}").matches("case.json").count(), 1, "{e:#}");
        // Nor is its reason repeated.
        assert_eq!(chain_text(&e), "case.json: entity not found");
    }
}
