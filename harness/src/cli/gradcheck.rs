//! `nanhunt gradcheck CASE.json`: finite-difference check of every gradient.

use super::{case_arg, Exit, LimitArgs};
use crate::gradcheck::{CheckPrecision, GradcheckOptions, Verdict};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The case file; its model and loss are checked in f64 (f32 for a
    /// model that cannot run in f64) at one batch.
    /// (Optional in a binary built with `nanhunt::cli::main_with`: its model\'s own case.)
    case: Option<PathBuf>,
    /// Check at the batch of this step.
    #[arg(long, default_value_t = 0)]
    batch: usize,
    /// Check the case at this seed (parameters and data) instead of its own.
    #[arg(long)]
    seed: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    limits: LimitArgs,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let (case, path) = case_arg(args.case.as_deref(), &args.limits.limits())?;
    let mut opts = GradcheckOptions::default();
    opts.batch = args.batch;
    opts.seed = args.seed;
    let factory = super::factory_of(&case)?;
    let report = crate::gradcheck::check_model_with(&case, factory.get(), &opts)
        .map_err(super::in_file(&path))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let precision = match report.precision {
            CheckPrecision::F64 => "f64",
            CheckPrecision::F32 => "f32",
        };
        println!(
            "gradcheck: {} / {} in {precision} at the batch of step {}, seed {} (|analytic - numeric| <= {:e} + {:e} * |gradient|, step {:e})",
            report.family, report.loss, report.batch, report.seed, report.atol, report.rtol, report.tolerance.step
        );
        if let Some(why) = &report.fallback {
            println!("  checked in f32: {why}");
        }
        if !report.lower_precision.is_empty() {
            println!(
                "  {} tensors compute below f64 inside the model (checked at f32's tolerance): {}",
                report.lower_precision.len(),
                report.lower_precision.join(", ")
            );
        }
        if let Some(problem) = &report.problem {
            println!("  {problem}");
        }
        for t in &report.tensors {
            let verdict = match t.verdict {
                Verdict::Agrees => "ok",
                Verdict::IllConditioned => "ILL",
                _ => "FAIL",
            };
            match (&t.note, t.has_gradient) {
                (_, false) => println!("  {verdict:4} {:40} received no gradient", t.name),
                (Some(note), _) if t.verdict != Verdict::Agrees => {
                    println!("  {verdict:4} {:40} {}: {note}", t.name, t.verdict.as_str())
                }
                _ => println!(
                    "  {verdict:4} {:40} max rel err {:.2e} (abs {:.2e}, {} coords)",
                    t.name, t.max_rel_err, t.max_abs_err, t.checked
                ),
            }
        }
        if let Some(coverage) = &report.coverage {
            println!("  no gradient: {}", coverage.summary());
        }
        let ill = report.with_verdict(Verdict::IllConditioned).len();
        let wrong = report.tensors.iter().filter(|t| t.verdict.fails()).count();
        println!(
            "{}",
            match (report.passed, wrong, ill) {
                (true, _, _) => "all gradients match".to_string(),
                _ if report.problem.is_some() => "not checked".to_string(),
                (false, 0, n) => format!(
                    "not passed: {n} tensors sit at a near-singular point where the gradient cannot be judged (see above; try another --batch or --seed)"
                ),
                (false, w, 0) => format!("gradient mismatch: {w} tensors"),
                (false, w, n) => format!(
                    "gradient mismatch: {w} tensors; {n} more cannot be judged at this point"
                ),
            }
        );
    }
    Ok(if report.passed {
        Exit::Clean
    } else {
        Exit::Found
    })
}
