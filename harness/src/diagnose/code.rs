//! The cause that lives in a user's own model code: the finding's
//! explanation at the producing stage ([`crate::explain`]) and an
//! intervention that guards that stage for a whole run
//! ([`crate::intervention`]), which verifies it.

use super::{at_knob_stage, Cause, CauseKind, Fix};
use crate::error::Result;
use crate::finding::{Finding, Outcome};
use crate::intervention::Intervention;
use crate::models::ModelFactory;
use crate::runner::RunOptions;
use crate::spec::{Case, ModelSpec};
use crate::training::run_model;

/// The code-bug cause of a custom model's finding at one of its recorded
/// stages; `None` for built-in families (their fixes are case fields),
/// findings without an explanation, and stages a declared knob acts on
/// (the knob is then the repair diagnose verifies).
pub(super) fn cause(
    case: &Case,
    finding: &Finding,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
    runs: &mut usize,
) -> Result<Option<Cause>> {
    let (ModelSpec::Custom(_), Some(e)) = (&case.model, finding.explanation.as_deref()) else {
        return Ok(None);
    };
    let knob_at_stage = case
        .model
        .knobs()
        .into_iter()
        .flatten()
        .any(|(_, k)| at_knob_stage(k, finding));
    if knob_at_stage {
        return Ok(None);
    }
    let intervention = Intervention {
        stage: e.stage.clone(),
        input: e.input.clone(),
        // An overflowing exp's repair is a clamp of its input: saturation.
        saturate: e.pattern == crate::finding::Pattern::ExpOverflow,
    };
    let guarded = RunOptions {
        intervention: Some(std::sync::Arc::new(intervention.clone())),
        ..opts.clone()
    };
    // A run that cannot be guarded (the gradient guard is a CPU op) is
    // reported, not an error of the whole diagnosis.
    let outcome = run_model(case, factory, &guarded);
    *runs += 1;
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
    Ok(Some(Cause {
        kind: CauseKind::CodeBug,
        title: format!(
            "a numerical bug in the model's code: {} at `{}`",
            e.pattern.as_str(),
            e.stage
        ),
        knob: None,
        article_step: CauseKind::CodeBug.article_step(),
        evidence: Vec::new(),
        fixes: vec![Fix {
            description: format!(
                "{} (an intervention standing in for the repair: {})",
                intervention.describe(),
                e.repair
            ),
            changes: Vec::new(),
            verified,
            result,
            intervention: Some(intervention),
        }],
        score: 0,
    }))
}

/// The code-bug cause's evidence: the explanation and the repair.
pub(super) fn evidence(finding: &Finding) -> Vec<String> {
    match finding.explanation.as_deref() {
        Some(e) => vec![e.sentence.clone(), format!("the repair: {}", e.repair)],
        None => Vec::new(),
    }
}
