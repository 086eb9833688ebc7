//! A numerical bug in a user's own model code (step 4): the finding's
//! explanation at the producing stage ([`crate::explain`]), verified by an
//! intervention that guards that stage for a whole run
//! ([`crate::intervention`]). Built-in families' fixes are case fields, a
//! finding without an explanation has no stage to guard, and a stage a
//! declared knob acts on is the knob's to repair.

use super::{at_knob_stage, code_evidence, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::{Cause, Fix};
use crate::error::Result;
use crate::finding::{Explanation, Outcome, Pattern};
use crate::intervention::Intervention;
use crate::spec::ModelSpec;

pub(in crate::diagnose) struct CodeBug;

impl Rule for CodeBug {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let (case, finding) = (ctx.case, ctx.finding);
        let (ModelSpec::Custom(_), Some(e)) = (&case.model, finding.explanation.as_deref()) else {
            return Ok(Vec::new());
        };
        let knob_at_stage = case
            .model
            .knobs()
            .into_iter()
            .flatten()
            .any(|(_, k)| at_knob_stage(k, finding));
        if knob_at_stage {
            return Ok(Vec::new());
        }
        let intervention = intervention(e);
        let fix = guarded_run(ctx, runs, intervention, &e.repair);
        let relevance = relevance(e);
        let title = title(e);
        let cause = Cause::new(
            CauseKind::CodeBug,
            title,
            None,
            code_evidence(finding),
            vec![fix],
            relevance,
        );
        Ok(vec![cause])
    }
}

/// An explained pattern at the stage that produced the failure outranks
/// what only removes its trigger (a lower LR, a smaller init).
pub(in crate::diagnose) fn relevance(e: &Explanation) -> Relevance {
    match e.pattern {
        Pattern::Unexplained => Relevance::Suspect(30),
        _ => Relevance::AtSite(25),
    }
}

pub(in crate::diagnose) fn title(e: &Explanation) -> String {
    format!(
        "a numerical bug in the model's code: {} at `{}`",
        e.pattern.as_str(),
        e.stage
    )
}

/// The intervention that stands in for the repair of `e`'s stage.
pub(in crate::diagnose) fn intervention(e: &Explanation) -> Intervention {
    match &e.formulation {
        Some(f) => Intervention {
            substitute: Some(f.substitute),
            at: f.replaces.clone(),
            ..Intervention::guard(&e.stage, Some(&f.reads), false)
        },
        // Without a formulation that fits, an overflowing exp's stand-in
        // is a clamp of its input: saturation. An op of instrumented code
        // is guarded at its site.
        None => {
            let saturate = matches!(e.pattern, Pattern::ExpOverflow | Pattern::ExpOfScaledInput);
            match &e.site {
                Some(site) => {
                    Intervention::guard_op(&e.stage, site.clone(), e.input_site.clone(), saturate)
                }
                None => Intervention::guard(&e.stage, e.input.as_deref(), saturate),
            }
        }
    }
}

/// The case run with `intervention` guarding the stage: a fix standing in
/// for `repair`. A run that cannot be guarded (the gradient guard is a CPU
/// op) is reported, not an error of the whole diagnosis.
fn guarded_run(ctx: &Context, runs: &mut Runs, intervention: Intervention, repair: &str) -> Fix {
    let case = ctx.case;
    let guarded = crate::runner::RunOptions {
        intervention: Some(std::sync::Arc::new(intervention.clone())),
        ..runs.opts.clone()
    };
    runs.count += 1;
    let outcome = crate::training::run_model(case, runs.factory, &guarded);
    let (verified, result) = match &outcome {
        Err(e) => (false, format!("could not run the intervention: {e}")),
        Ok(Outcome::Stable { .. }) => (true, format!("stable over all {} steps", case.steps)),
        Ok(Outcome::Unstable { finding: next }) => (
            false,
            format!(
                "unstable: trained {} of {} steps, then {} in {} at `{}`",
                next.step,
                case.steps,
                next.kind.as_str(),
                next.phase.as_str(),
                next.stage
            ),
        ),
        Ok(Outcome::Rejected { reason }) => (false, format!("rejected: {reason}")),
    };
    let description = match intervention.substitute {
        Some(_) => intervention.describe(),
        None => format!(
            "{} (an intervention standing in for the repair: {repair})",
            intervention.describe()
        ),
    };
    Fix {
        description,
        changes: Vec::new(),
        verified,
        result,
        intervention: Some(intervention),
        learning: outcome
            .as_ref()
            .ok()
            .and_then(crate::diagnose::Learning::of),
        workaround: false,
    }
}
