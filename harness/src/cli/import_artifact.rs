//! `nanhunt import-artifact FILE --target NAME`: a libFuzzer crash artifact
//! of one of the `fuzz/` targets, decoded exactly as the target decoded it.
//! For the training targets it becomes a case and, when the run fails with
//! a signature, a minimized reproducer (in `corpora/repro/` by default).

use super::Exit;
use crate::campaign::reproducer_name;
use crate::files::write_atomic;
use crate::fuzzing::{self, decode, Envelope, Verdict, TARGETS, TRAINING_TARGETS};
use crate::minimize::{minimize, MinimizeOptions};
use crate::rng::fnv1a;
use crate::RunOptions;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum EnvelopeArg {
    Documented,
    Planted,
}

#[derive(clap::Args)]
pub struct Args {
    /// The artifact (e.g. fuzz/artifacts/safe_envelope/crash-…).
    artifact: PathBuf,
    /// The fuzz target that wrote it.
    #[arg(long, value_parser = TARGETS)]
    target: String,
    /// Where reproducers and cases go.
    #[arg(long, default_value = "corpora/repro")]
    out: PathBuf,
    /// The envelope the safe_envelope target ran with (default: from
    /// NANHUNT_ENVELOPE, as the target reads it).
    #[arg(long, value_enum)]
    envelope: Option<EnvelopeArg>,
    /// Training runs the minimizer may spend.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_runs: u64,
}

/// Runs the target on the artifact; a panic is reported, not propagated.
fn verdict(target: &str, bytes: &[u8], envelope: Envelope) -> Verdict {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(|| fuzzing::check(target, bytes, envelope));
    std::panic::set_hook(hook);
    match result {
        Ok(v) => v.expect("clap checked the target name"),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            Verdict::Violation(format!("panicked: {msg}"))
        }
    }
}

fn describe(v: &Verdict) -> String {
    match v {
        Verdict::Reject => "rejected: not a valid input for this target".into(),
        // A fuzz build checks integer overflow; a build without debug
        // assertions wraps instead, so an overflow panic cannot show here.
        Verdict::Pass if !cfg!(debug_assertions) => "passes now in this build, which does not \
            check integer overflow as the fuzz build does (judge an overflow artifact with \
            `cargo run -p nanhunt -- import-artifact`)"
            .into(),
        Verdict::Pass => "passes now (the failure no longer reproduces)".into(),
        Verdict::Violation(m) => format!("fails: {m}"),
    }
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let bytes = crate::files::read_bounded(&args.artifact, crate::files::MAX_DOCUMENT_BYTES)?;
    let envelope = match args.envelope {
        Some(EnvelopeArg::Documented) => Envelope::Documented,
        Some(EnvelopeArg::Planted) => Envelope::Planted,
        None => Envelope::from_env(),
    };
    let target = args.target.as_str();
    let v = verdict(target, &bytes, envelope);
    eprintln!("{target}: {}", describe(&v));
    if !TRAINING_TARGETS.contains(&target) {
        let input = match target {
            "losses" => serde_json::to_string_pretty(
                &decode::loss_input(&mut arbitrary::Unstructured::new(&bytes), |l| {
                    crate::losses::stable_domain(l).unwrap_or(1e36)
                })
                .map_err(|e| {
                    anyhow::anyhow!("{}: does not decode: {e}", args.artifact.display())
                })?,
            )?,
            "augmentations" => serde_json::to_string_pretty(
                &decode::augment_input(
                    &mut arbitrary::Unstructured::new(&bytes),
                    crate::augment::DOCUMENTED_MAX_INPUT,
                )
                .map_err(|e| {
                    anyhow::anyhow!("{}: does not decode: {e}", args.artifact.display())
                })?,
            )?,
            _ => String::from_utf8_lossy(&bytes).into_owned(),
        };
        println!("{input}");
        return Ok(found(&v));
    }
    let case = fuzzing::training_case(target, &bytes, envelope).ok_or_else(|| {
        anyhow::anyhow!(
            "{}: does not decode to a case for `{target}`",
            args.artifact.display()
        )
    })?;
    std::fs::create_dir_all(&args.out).map_err(|e| crate::Error::io(&args.out, e))?;
    let opts = MinimizeOptions::default()
        .with_max_runs(args.max_runs as usize)
        .with_run(RunOptions::default().with_limits(fuzzing::limits()));
    let source = format!(
        "nanhunt import-artifact --target {target} {}",
        args.artifact.display()
    );
    // safe_envelope's violations are instabilities: minimize them by
    // signature. case_runs' are panics or errors: keep the case as it is.
    let minimized = match &v {
        Verdict::Violation(_) if target == "safe_envelope" => minimize(&case, None, &opts)?,
        _ => None,
    };
    match minimized {
        Some(m) => {
            let path = args.out.join(reproducer_name(&m.signature, &m.case));
            m.reproducer(&case, source).write(&path)?;
            eprintln!(
                "signature: {} ({} runs to minimize)\nreproducer: {}\nreplay: nanhunt replay {}",
                m.signature,
                m.runs,
                path.display(),
                path.display()
            );
        }
        None => {
            // A panic or an error is a harness bug, not an instability: keep the case.
            let path = case_path(&args.out, target, &case.to_json());
            write_atomic(&path, case.to_json().as_bytes())?;
            eprintln!(
                "case: {}\nrun: nanhunt run {}",
                path.display(),
                path.display()
            );
        }
    }
    Ok(found(&v))
}

fn case_path(out: &Path, target: &str, json: &str) -> PathBuf {
    out.join(format!(
        "{target}-{:08x}.case.json",
        fnv1a(json.as_bytes()) as u32
    ))
}

fn found(v: &Verdict) -> Exit {
    match v {
        Verdict::Violation(_) => Exit::Found,
        _ => Exit::Clean,
    }
}
