//! A numerical bug in a user's own model code (step 4): the finding's
//! explanation at the producing op or stage ([`crate::explain`]), repaired
//! for a whole run through the tracer ([`crate::intervention`]): the op's
//! expression rewritten in its stable form (instrumented code: the diff
//! of the user's line), or the stage's stable formulation substituted.
//! Either is trained over the case like every other fix. Setting the
//! op's non-finite outputs to 0 is run too, as evidence of where the
//! failure comes from — a diagnostic, never a fix. Built-in families'
//! fixes are case fields, a finding without an explanation has no op to
//! repair, and a stage a declared knob acts on is the knob's to repair.

use super::{at_knob_stage, code_evidence, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::{Cause, Fix};
use crate::error::Result;
use crate::finding::{Explanation, Outcome, Pattern, Rewrite};
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
        let mut fixes = Vec::new();
        if let Some(r) = &e.rewrite {
            fixes.push(rewritten_run(ctx, runs, e, r)?);
        }
        if let Some(iv) = substituted(e) {
            fixes.push(repaired_run(ctx, runs, iv));
        }
        let mut evidence = code_evidence(finding);
        evidence.push(guarded_run(ctx, runs, guard(e)));
        let relevance = relevance(e);
        let title = title(e);
        let cause = Cause::new(CauseKind::CodeBug, title, None, evidence, fixes, relevance);
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

/// The stage's stable formulation substituted, where one fits it.
pub(in crate::diagnose) fn substituted(e: &Explanation) -> Option<Intervention> {
    let f = e.formulation.as_ref()?;
    Some(Intervention {
        substitute: Some(f.substitute),
        at: f.replaces.clone(),
        ..Intervention::guard(&e.stage, Some(&f.reads), false)
    })
}

/// The guard of `e`'s op or stage: its non-finite outputs set to 0 (an
/// overflowing exp's saturated), and the non-finite gradients it passes
/// back. A diagnostic of where the failure comes from, not a repair.
pub(in crate::diagnose) fn guard(e: &Explanation) -> Intervention {
    let saturate = matches!(e.pattern, Pattern::ExpOverflow | Pattern::ExpOfScaledInput);
    match &e.site {
        Some(site) => {
            Intervention::guard_op(&e.stage, site.clone(), e.input_site.clone(), saturate)
        }
        None => Intervention::guard(&e.stage, e.input.as_deref(), saturate),
    }
}

/// The case run with `intervention` in place: `Some(outcome)` or the
/// reason it could not run (the gradient guard is a CPU op).
fn run_with(
    ctx: &Context,
    runs: &mut Runs,
    intervention: &Intervention,
) -> std::result::Result<Outcome, String> {
    let opts = crate::runner::RunOptions {
        intervention: Some(std::sync::Arc::new(intervention.clone())),
        ..runs.opts.clone()
    };
    runs.count += 1;
    crate::training::run_model(ctx.case, runs.factory, &opts).map_err(|e| e.to_string())
}

/// "stable over all 60 steps", or where it failed.
fn outcome_text(ctx: &Context, outcome: &std::result::Result<Outcome, String>) -> String {
    let steps = ctx.case.steps;
    match outcome {
        Err(e) => format!("could not run it: {e}"),
        Ok(Outcome::Stable { .. }) => format!("stable over all {steps} steps"),
        Ok(Outcome::Unstable { finding: next }) => format!(
            "unstable: trained {} of {steps} steps, then {} in {} at `{}`",
            next.step,
            next.kind.as_str(),
            next.phase.as_str(),
            next.stage
        ),
        Ok(Outcome::Rejected { reason }) => format!("rejected: {reason}"),
    }
}

/// The most ops one repair rewrites.
const MAX_REWRITES: usize = 4;

/// The larger eps (or floors) a rewrite's is raised to when its own does
/// not pass: the dtype's smallest safe value first, then what a developer
/// would reach for next (a variance's 1/σ² floored at 1e-8 still diverges).
const EPS_LADDER: [f64; 2] = [1e-5, 1e-3];

/// What a run with a set of rewrites in place gave.
pub(in crate::diagnose) struct Attempt<T> {
    /// It passed (the caller's judgement: it trained, or the trigger's
    /// step passed and the rest held).
    pub passed: bool,
    /// The rewrite of the op it failed at next, where it failed at one.
    pub next: Option<Rewrite>,
    pub result: T,
}

/// The rewrites that repair the failure `first` is the rewrite of: `first`
/// and the rewrite of each op a run then fails at next (a repair is every
/// line the failure passes through: a cosine's roots at 0 after its
/// denominator), at the rewrite's own eps and then up the ladder. The set
/// that passed with what its run gave, or the last one tried.
pub(in crate::diagnose) fn search<T>(
    first: &Rewrite,
    mut attempt: impl FnMut(&[Rewrite]) -> Result<Attempt<T>>,
) -> Result<(Vec<Rewrite>, T)> {
    let mut last = None;
    let rungs = std::iter::once(None).chain(EPS_LADDER.into_iter().map(Some));
    for rung in rungs {
        let at = |r: &Rewrite| match rung {
            Some(eps) => r.with_eps(eps).unwrap_or_else(|| r.clone()),
            None => r.clone(),
        };
        if rung.is_some_and(|eps| first.with_eps(eps).is_none()) {
            continue;
        }
        let mut set = vec![at(first)];
        loop {
            let a = attempt(&set)?;
            if a.passed {
                return Ok((set, a.result));
            }
            match a.next {
                Some(r) if set.len() < MAX_REWRITES && set.iter().all(|s| s.site != r.site) => {
                    set.push(at(&r))
                }
                _ => {
                    last = Some((set, a.result));
                    break;
                }
            }
        }
    }
    Ok(last.expect("the first rung always runs"))
}

/// The case trained with the rewrites that repair `first`'s failure in
/// place ([`search`]): a fix, judged with the others.
fn rewritten_run(ctx: &Context, runs: &mut Runs, e: &Explanation, first: &Rewrite) -> Result<Fix> {
    let (set, outcome) = search(first, |set| {
        let iv = Intervention::rewrite(&e.stage, set.to_vec());
        let outcome = run_with(ctx, runs, &iv);
        let (passed, next) = match &outcome {
            Ok(o @ Outcome::Stable { .. }) => (
                crate::diagnose::Learning::of(o).is_some_and(|l| l.learns_on_its_own()),
                None,
            ),
            Ok(Outcome::Unstable { finding }) => (
                false,
                finding
                    .explanation
                    .as_deref()
                    .and_then(|x| x.rewrite.clone()),
            ),
            _ => (false, None),
        };
        Ok(Attempt {
            passed,
            next,
            result: outcome,
        })
    })?;
    Ok(fix_of(ctx, Intervention::rewrite(&e.stage, set), outcome))
}

/// The case trained with a repair in place: a fix, verified when it
/// trains ([`crate::diagnose::learning`] judges it with the others).
fn repaired_run(ctx: &Context, runs: &mut Runs, intervention: Intervention) -> Fix {
    let outcome = run_with(ctx, runs, &intervention);
    fix_of(ctx, intervention, outcome)
}

/// The fix a run with `intervention` in place gave.
fn fix_of(
    ctx: &Context,
    intervention: Intervention,
    outcome: std::result::Result<Outcome, String>,
) -> Fix {
    Fix {
        description: intervention.describe(),
        changes: Vec::new(),
        verified: matches!(outcome, Ok(Outcome::Stable { .. })),
        result: outcome_text(ctx, &outcome),
        diffs: crate::finding::line_diffs(&intervention.rewrites),
        learning: outcome
            .as_ref()
            .ok()
            .and_then(crate::diagnose::Learning::of),
        intervention: Some(intervention),
        workaround: false,
        passes_step: false,
    }
}

/// The case trained with the op guarded: the evidence line it gives.
fn guarded_run(ctx: &Context, runs: &mut Runs, intervention: Intervention) -> String {
    let outcome = run_with(ctx, runs, &intervention);
    let verdict = match &outcome {
        Ok(Outcome::Stable { .. }) => "the failure comes from there",
        _ => "the failure does not come from there alone",
    };
    format!(
        "diagnostic, not a repair: {} — {}; {verdict}",
        intervention.describe(),
        outcome_text(ctx, &outcome)
    )
}
