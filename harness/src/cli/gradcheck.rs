//! `nanhunt gradcheck CASE.json`: finite-difference check of every gradient.

use super::{load_case, Exit, LimitArgs};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The case file; its model and loss are checked in f64 on its first batch.
    case: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    limits: LimitArgs,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let case = load_case(&args.case, &args.limits.limits())?;
    let report = nanhunt::gradcheck::check_case(&case).map_err(super::in_file(&args.case))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "gradcheck: {} / {} (|analytic - numeric| <= {:e} + {:e} * |gradient|)",
            report.family, report.loss, report.atol, report.rtol
        );
        for t in &report.tensors {
            let verdict = if t.passed { "ok" } else { "FAIL" };
            if t.has_gradient {
                println!(
                    "  {verdict:4} {:40} max rel err {:.2e} (abs {:.2e}, {} coords)",
                    t.name, t.max_rel_err, t.max_abs_err, t.checked
                );
            } else {
                println!("  {verdict:4} {:40} received no gradient", t.name);
            }
        }
        println!(
            "{}",
            if report.passed {
                "all gradients match"
            } else {
                "gradient mismatch"
            }
        );
    }
    Ok(if report.passed {
        Exit::Clean
    } else {
        Exit::Found
    })
}
