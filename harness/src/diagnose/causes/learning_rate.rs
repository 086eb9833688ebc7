//! Learning rate too high (step 3): searched down by decades to the first
//! rate that trains stably, then narrowed towards the highest stable one.
//! It cannot have caused a failure at step 0 outside the update (no update
//! had run), nor a missing gradient.

use super::{cause, CauseKind, Context, Relevance, Rule, Runs};
use crate::diagnose::{growth_phrase, Cause, Fix};
use crate::error::Result;
use crate::finding::{Finding, FindingKind, Outcome, Phase};
use crate::spec::{case_diff, round1};

/// Decades the learning-rate search goes down at most.
pub const LR_SEARCH_DECADES: i32 = 8;

pub(in crate::diagnose) struct LearningRate;

impl Rule for LearningRate {
    fn causes(&self, ctx: &Context, runs: &mut Runs) -> Result<Vec<Cause>> {
        let f = ctx.finding;
        let before_any_update = f.step == 0 && f.phase != Phase::Update;
        if f.kind == FindingKind::NoGradient || before_any_update {
            return Ok(Vec::new());
        }
        let fixes = lr_search(ctx, runs)?;
        Ok(cause(
            CauseKind::LearningRate,
            fixes,
            trend_evidence(ctx),
            relevance(f),
        ))
    }
}

/// A divergence or an explosion is the learning rate's to explain; a
/// failure of the update is a suspect's.
pub(in crate::diagnose) fn relevance(f: &Finding) -> Relevance {
    match (f.kind, f.phase) {
        (FindingKind::Divergence, _) => Relevance::AtSite(10),
        (FindingKind::Explosion, _) => Relevance::AtSite(8),
        (_, Phase::Update) => Relevance::Suspect(25),
        _ => Relevance::Suspect(10),
    }
}

/// What the gradient norm and the learning rate say (the LR's and the
/// clipping's evidence).
pub(super) fn trend_evidence(ctx: &Context) -> Vec<String> {
    let f = ctx.finding;
    let mut e = Vec::new();
    if let Some(g) = ctx.growth {
        e.push(growth_phrase(g));
    }
    if matches!(f.kind, FindingKind::Divergence | FindingKind::Explosion) {
        e.push(f.detail.clone());
    }
    e.push(format!("learning rate {:e}", ctx.case.optimizer.lr()));
    e
}

/// Searches down from the case's learning rate by factors of 10 to the
/// first LR that trains stably, then narrows the last decade twice (halving
/// it in log scale) towards the highest stable LR. Every LR tried is a fix,
/// verified or not: the highest stable first, the unstable ones after it.
fn lr_search(ctx: &Context, runs: &mut Runs) -> Result<Vec<Fix>> {
    let case = ctx.case;
    let lr = case.optimizer.lr();
    let mut tried: Vec<(f64, Fix)> = Vec::new();
    if lr <= 0.0 {
        return Ok(Vec::new());
    }
    let mut try_lr = |to: f64, tried: &mut Vec<(f64, Fix)>| -> Result<bool> {
        let mut c = case.clone();
        c.optimizer.set_lr(to);
        let outcome = runs.outcome(&c)?;
        let verified = matches!(outcome, Outcome::Stable { .. });
        let fix = Fix {
            description: format!("learning rate {lr:e} -> {to:e}"),
            changes: case_diff(case, &c),
            verified,
            result: crate::diagnose::context::result_text(&outcome),
            intervention: None,
            learning: crate::diagnose::Learning::of(&outcome),
            workaround: false,
            diffs: Vec::new(),
            passes_step: false,
        };
        tried.push((to, fix));
        Ok(verified)
    };
    let (mut unstable, mut stable) = (lr, None);
    for decade in 1..=LR_SEARCH_DECADES {
        // Printed and parsed back: 3e-3 / 10 is 3e-4, not 3.0000000000000003e-4.
        let to: f64 = format!("{:.6e}", lr / 10f64.powi(decade))
            .parse()
            .expect("a formatted float");
        if try_lr(to, &mut tried)? {
            stable = Some(to);
            break;
        }
        unstable = to;
    }
    if let Some(mut s) = stable {
        for _ in 0..2 {
            let mid = round1((unstable * s).sqrt());
            if mid <= s || mid >= unstable {
                break;
            }
            if try_lr(mid, &mut tried)? {
                s = mid;
            } else {
                unstable = mid;
            }
        }
    }
    tried.sort_by(|(la, a), (lb, b)| {
        b.verified
            .cmp(&a.verified)
            .then(if a.verified && b.verified {
                lb.total_cmp(la)
            } else {
                std::cmp::Ordering::Equal
            })
    });
    Ok(tried.into_iter().map(|(_, f)| f).collect())
}
