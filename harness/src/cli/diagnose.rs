//! `nanhunt diagnose CASE.json`: the five steps, with verified fixes.
//! `nanhunt diagnose DIR`: a scene with its case (a hunt's reproducer, a
//! run's dump), diagnosed over that case ([`crate::diagnose::diagnose_dir`]).

use super::{case_arg, Exit, LimitArgs};
use crate::diagnose::Diagnosis;
use crate::spec::DeviceSpec;
use crate::RunOptions;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The case file, or a scene directory that holds its case (a hunt's
    /// reproducer, a run's `--dump`).
    /// (Optional in a binary built with `nanhunt::cli::main_with`: its model\'s own case.)
    case: Option<PathBuf>,
    /// Print the diagnosis as JSON.
    #[arg(long)]
    json: bool,
    /// Write the crash dump of the failure to this directory (must not exist).
    #[arg(long)]
    dump: Option<PathBuf>,
    /// Run on this device instead of the case's.
    #[arg(long)]
    device: Option<DeviceSpec>,
    #[command(flatten)]
    limits: LimitArgs,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let limits = args.limits.limits();
    let mut opts = RunOptions::default().with_limits(limits.clone());
    opts.device = args.device;
    let mut origin = None;
    let d = match args.case.as_deref().filter(|p| p.is_dir()) {
        Some(dir) => {
            if args.dump.is_some() {
                anyhow::bail!("--dump: a scene is diagnosed from its own dump; give a case file to dump a new one");
            }
            let saved = crate::scene::SavedScene::load(dir)?;
            let Some(case) = saved.case else {
                anyhow::bail!(
                    "{}: a guard's scene has no case.json: diagnose it in the model's binary with nanhunt::diagnose::diagnose_scene",
                    dir.display()
                );
            };
            let factory = super::factory_of(&case)?;
            let hunt = crate::hunt::HuntOptions::default();
            crate::diagnose::diagnose_dir(dir, Some(factory.get()), &opts, &hunt)
                .map_err(super::in_file(dir))?
        }
        None => {
            let (case, path) = case_arg(args.case.as_deref(), &limits)?;
            let factory = super::factory_of(&case)?;
            opts.dump = args.dump.clone();
            // A minimized reproducer is diagnosed over the case it came
            // from: its fixes train over that, never over the few steps
            // the minimizer kept (unless that case no longer fails).
            let original = super::minimized_from(&path, &limits)
                .map(|o| crate::diagnose::diagnose(&o, factory.get(), &opts))
                .transpose()
                .map_err(super::in_file(&path))?
                .filter(|d| d.finding.is_some());
            match original {
                Some(d) => {
                    origin = Some("the case it was minimized from (its provenance)");
                    d
                }
                None => crate::diagnose::diagnose(&case, factory.get(), &opts)
                    .map_err(super::in_file(&path))?,
            }
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        if let Some(origin) = origin {
            println!("diagnosed over {origin}");
        }
        print(&d, args.dump.as_ref());
    }
    Ok(if d.finding.is_some() {
        Exit::Found
    } else {
        Exit::Clean
    })
}

fn print(d: &Diagnosis, dump: Option<&PathBuf>) {
    let Some(f) = &d.finding else {
        println!("the case trained stably: nothing to diagnose");
        return;
    };
    println!("step 1, reproduce: {} at step {}", f.signature, f.step);
    println!("  {}", f.detail);
    if let Some(e) = &f.explanation {
        println!("  explanation: {}", e.sentence);
    }
    if let Some(dir) = dump {
        println!("  crash dump: {}", dir.display());
    }
    for (label, scan) in [("before", &d.batch_raw), ("after", &d.batch_augmented)] {
        if let Some(s) = scan {
            let found = s.findings();
            let text = if found.is_empty() {
                "clean".to_string()
            } else {
                found.join("; ")
            };
            println!("step 2, data {label} augmentation: {text}");
        }
    }
    if let Some(scan) = &d.dataset {
        let bad = scan.bad_samples();
        let text = if bad.is_empty() {
            "no sample with a bad value or label".to_string()
        } else {
            format!(
                "{} flagged ({})",
                crate::data::samples_phrase(&bad),
                scan.problems
                    .iter()
                    .filter(|p| p.kind.is_error())
                    .map(|p| p.kind.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        println!(
            "step 2, whole dataset ({} samples of {}): {text}",
            scan.samples, scan.dataset
        );
    }
    match d.grad_norm_growth {
        Some(g) => println!(
            "step 3, gradients: {} ({} steps)",
            crate::diagnose::growth_phrase(g),
            f.trace.grad_norms.len()
        ),
        None => println!("step 3, gradients: no norm history before the failure"),
    }
    if let Some(h) = &d.hardware {
        let arms: Vec<&str> = h.arms.iter().map(|a| a.label.as_str()).collect();
        let verdict = if h.agrees() {
            format!("agree within `{}`", h.tolerance.name)
        } else {
            let mut parts: Vec<String> = h
                .disagreements
                .iter()
                .map(|x| {
                    format!(
                        "{} leaves {} at step {} ({} rel. diff. {:.2e})",
                        x.arm, h.reference, x.step, x.quantity, x.rel_diff
                    )
                })
                .collect();
            parts.extend(
                h.one_sided
                    .iter()
                    .map(|o| format!("non-finite on {} only at step {}", o.arm, o.step)),
            );
            parts.join("; ")
        };
        println!("step 5, differential ({}): {verdict}", arms.join(" vs "));
    }
    println!("ranked causes ({} training runs):", d.runs);
    if d.supported == 0 && !d.causes.is_empty() {
        println!("    none is supported: no tried fix helped and none has evidence at the failure's site");
    }
    for (i, c) in d.causes.iter().enumerate() {
        let tag = if c.fixes.is_empty() {
            " [no repair to try: none is known for this op's pattern]"
        } else if c.repaired() {
            " [verified fix]"
        } else if c.verified() {
            " [verified workaround: it removes the trigger, not the cause]"
        } else {
            " [ruled out: no tried fix helped]"
        };
        println!("{:2}. {} (step {}){tag}", i + 1, c.title, c.article_step);
        for e in &c.evidence {
            println!("      evidence: {e}");
        }
        for fix in &c.fixes {
            let mark = if fix.verified { "FIX" } else { "   " };
            println!("      {mark} {}: {}", fix.description, fix.result);
            for diff in &fix.diffs {
                for line in diff.to_string().lines() {
                    println!("            {line}");
                }
            }
            if fix.verified {
                for ch in &fix.changes {
                    println!("            {}: {} -> {}", ch.path, ch.before, ch.after);
                }
            }
        }
    }
}
