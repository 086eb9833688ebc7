//! A knob the model declares (step 4): values across its range, each a
//! verified fix or not; the knob at the failing stage fits it best.

use super::{at_knob_stage, code_evidence, tried, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::context::variant;
use crate::diagnose::Cause;
use crate::error::Result;
use crate::finding::{Finding, OpKind};
use crate::spec::KnobSpec;

/// Values tried per declared model knob.
pub const KNOB_CANDIDATES: usize = 5;

pub(in crate::diagnose) struct ModelKnob;

impl Rule for ModelKnob {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let mut causes = Vec::new();
        for (name, knob) in ctx.case.model.knobs().into_iter().flatten() {
            let variants = knob
                .candidates(KNOB_CANDIDATES)
                .into_iter()
                .map(|value| {
                    let description = format!("model knob `{name}` {:e} -> {value:e}", knob.value);
                    variant(description, ctx.case, |c| {
                        if let Some(k) = c.model.knobs_mut().and_then(|k| k.get_mut(name)) {
                            k.value = value;
                        }
                    })
                })
                .collect();
            let fixes = tried(CauseKind::ModelKnob, variants, ctx, runs)?;
            if fixes.is_empty() {
                continue;
            }
            let mut evidence = evidence(name, knob, ctx.finding);
            if at_knob_stage(knob, ctx.finding) {
                evidence.extend(code_evidence(ctx.finding));
            }
            let title = format!("the model knob `{name}`");
            let mut cause = Cause::new(
                CauseKind::ModelKnob,
                title,
                None,
                evidence,
                fixes,
                relevance(name, knob, ctx.finding),
            );
            cause.knob = Some(name.clone());
            causes.push(cause);
        }
        Ok(causes)
    }
}

/// A knob explains a finding at the stage it declares it acts on, an eps
/// knob a norm's failure; else it is a weak suspect.
fn relevance(name: &str, knob: &KnobSpec, f: &Finding) -> Relevance {
    let norm = f.op.is_some_and(|o| o.kind == OpKind::Norm);
    match (at_knob_stage(knob, f), norm && name.contains("eps")) {
        (true, _) => Relevance::AtSite(15),
        (false, true) => Relevance::AtSite(0),
        _ => Relevance::Suspect(15),
    }
}

fn evidence(name: &str, knob: &KnobSpec, f: &Finding) -> Vec<String> {
    let mut e = vec![format!(
        "the model declares knob `{name}` = {:e} (range [{:e}, {:e}])",
        knob.value, knob.min, knob.max
    )];
    if at_knob_stage(knob, f) {
        e.push(format!(
            "the failure is {} in {} at `{}`, the stage the knob acts on",
            f.kind.as_str(),
            f.phase.as_str(),
            f.stage
        ));
    }
    e
}
