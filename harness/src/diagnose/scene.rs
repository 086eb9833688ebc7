//! Diagnose's driver for the scene of a user's own guarded loop, with the
//! user's variables and loss closure instead of a case and a factory.
//!
//! The scene's case is its batch: each candidate fix (the op rewritten, a
//! guarded stage, the flagged batch rows left out, a larger optimizer eps,
//! a lower learning rate, the tensors without a gradient declared frozen)
//! trains from the scene's state for [`MIN_STEPS`] steps on that batch,
//! through the user's closure and the scene's optimizer, and is judged by
//! the case diagnosis's own rule (`learning.rs`): verified only when it
//! trained stably and learned. Where the loop's optimizer kept its state
//! private, only the failing step can be replayed: a fix with which it
//! passes is marked so ([`Fix::passes_step`]) and never "verified". The
//! causes' relevance, titles and evidence are the case diagnosis's own
//! ([`super::causes`]), and they are ranked by the same rule.

use super::causes::{self, CauseKind};
use super::learning::{self, Learning, MIN_STEPS};
use super::rank::{rank, Relevance};
use super::{Cause, Diagnosis, Fix};
use crate::checks;
use crate::error::{Error, Result};
use crate::finding::{Finding, FindingKind, Outcome, Phase, ReplayVerdict, Robustness};
use crate::guard::{replay_changed, train_changed, Batch, Changes};
use crate::intervention::Intervention;
use crate::probe::scan_all;
use crate::scene::{OptimizerRecord, SavedScene};
use candle_core::Tensor;
use std::path::Path;

/// What a scene's fix says when only its failing step could be replayed.
pub const ONE_STEP: &str = "the failing step passes every check with it (one step replayed: the loop's optimizer kept its state private, so whether it trains is not judged)";

/// Diagnoses the failing step of a guard's scene in `dir`, replaying it
/// with the variables of `varmap` (the user's model, built as when the
/// scene was written) and the user's loss closure; each fix trains from
/// the scene on its batch.
pub fn diagnose_scene(
    dir: &Path,
    varmap: &candle_nn::VarMap,
    mut loss_of: impl FnMut(&Batch) -> candle_core::Result<Tensor>,
) -> Result<Diagnosis> {
    let saved = SavedScene::load(dir)?;
    let finding = saved.scene.finding.clone().ok_or_else(|| {
        Error::option(
            "scene",
            "the scene is of a healthy step: nothing to diagnose",
        )
    })?;
    let trains = matches!(saved.scene.optimizer, OptimizerRecord::Saved { .. });
    let mut runs = 0;
    let mut try_fix = |description: String, changes: Changes, train: bool| -> Result<Fix> {
        runs += 1;
        let intervention = changes.intervention.clone();
        let (passes_step, learning, result) = if trains && train {
            let t = train_changed(dir, varmap, &changes, MIN_STEPS, &mut loss_of)?;
            let result = match &t.outcome {
                Outcome::Unstable { finding: f } => format!(
                    "unstable at step {} of {MIN_STEPS} on the scene's batch: {}",
                    f.step + 1 - finding.step,
                    f.signature.slug()
                ),
                _ => "stable".to_string(),
            };
            (
                t.step.verdict == ReplayVerdict::Fixed,
                Learning::of(&t.outcome),
                result,
            )
        } else {
            let report = replay_changed(dir, varmap, &changes, &mut loss_of)?;
            let result = match &report.actual {
                None => ONE_STEP.to_string(),
                Some(f) => format!("unstable: {}", f.signature.slug()),
            };
            (report.verdict == ReplayVerdict::Fixed, None, result)
        };
        Ok(Fix {
            description,
            changes: Vec::new(),
            verified: false,
            result,
            diffs: intervention
                .as_ref()
                .map(|i| crate::finding::line_diffs(&i.rewrites))
                .unwrap_or_default(),
            intervention,
            learning,
            workaround: false,
            passes_step,
        })
    };
    let mut all = Vec::new();
    all.extend(code_bug(&finding, &mut try_fix)?);
    let data_cause = data(&saved, &finding, &mut try_fix)?;
    let data_clean = data_cause.is_none();
    all.extend(data_cause);
    all.extend(optimizer(&saved, &finding, &mut try_fix)?);
    all.extend(no_backward(&finding, &mut try_fix)?);
    all.extend(precision(&finding));
    learning::judge(&mut all, &finding, data_clean);
    let supported = rank(&mut all);
    Ok(Diagnosis {
        finding: Some(finding),
        batch_raw: None,
        batch_augmented: None,
        dataset: None,
        grad_norm_growth: None,
        causes: all,
        supported,
        hardware: None,
        runs,
    })
}

/// Where a scene's fix trains.
const ON_SCENE: &str = "trained from the scene on its batch";

type TryFix<'a> = dyn FnMut(String, Changes, bool) -> Result<Fix> + 'a;

/// The explained op rewritten, or its stage's formulation substituted
/// (the code's own bug); the guard of it as evidence of where the
/// failure comes from.
fn code_bug(f: &Finding, try_fix: &mut TryFix) -> Result<Option<Cause>> {
    let Some(e) = f.explanation.as_deref() else {
        return Ok(None);
    };
    let rewrite = e
        .rewrite
        .as_ref()
        .map(|r| Intervention::rewrite(&e.stage, vec![r.clone()]));
    let mut fixes = Vec::new();
    for iv in rewrite.into_iter().chain(causes::code::substituted(e)) {
        let description = format!("{}, {ON_SCENE}", iv.describe());
        let changes = Changes {
            intervention: Some(iv),
            ..Changes::default()
        };
        fixes.push(try_fix(description, changes, true)?);
    }
    let guard = causes::code::guard(e);
    let guarded = try_fix(
        String::new(),
        Changes {
            intervention: Some(guard.clone()),
            ..Changes::default()
        },
        false,
    )?;
    let mut evidence = causes::code_evidence(f);
    evidence.push(format!(
        "diagnostic, not a repair: {} — on the failing step, {}",
        guard.describe(),
        match guarded.passes_step {
            true => "every check passes: the failure comes from there",
            false => "the step still fails: the failure does not come from there alone",
        }
    ));
    let relevance = causes::code::relevance(e);
    let title = causes::code::title(e);
    Ok(Some(Cause::new(
        CauseKind::CodeBug,
        title,
        None,
        evidence,
        fixes,
        relevance,
    )))
}

/// A data failure: the batch rows the data check flags, left out.
fn data(saved: &SavedScene, f: &Finding, try_fix: &mut TryFix) -> Result<Option<Cause>> {
    if f.phase != Phase::Data {
        return Ok(None);
    }
    let mut rows = Vec::new();
    for (_, t) in saved.batch_parts()? {
        if !t.dtype().is_float() || t.rank() == 0 {
            continue;
        }
        for (r, row) in (0..t.dim(0)?).zip(t.chunk(t.dim(0)?, 0)?) {
            let bad = checks::batch_values(&scan_all(&[&row])?[0], t.dtype()).is_some();
            if bad && !rows.contains(&r) {
                rows.push(r);
            }
        }
    }
    if rows.is_empty() {
        return Ok(None);
    }
    let description = format!(
        "the batch without the {} rows the data check flags ({rows:?})",
        rows.len()
    );
    let changes = Changes {
        drop_rows: rows,
        ..Changes::default()
    };
    let fix = try_fix(description, changes, true)?;
    let evidence = vec![format!(
        "the failure is {} in {} at `{}`",
        f.kind.as_str(),
        f.phase.as_str(),
        f.stage
    )];
    let relevance = causes::data::relevance(f);
    Ok(Some(Cause::new(
        CauseKind::Data,
        CauseKind::Data.title().into(),
        None,
        evidence,
        vec![fix],
        relevance,
    )))
}

/// The update: a larger eps, and lower learning rates, each on the step.
fn optimizer(saved: &SavedScene, f: &Finding, try_fix: &mut TryFix) -> Result<Vec<Cause>> {
    let OptimizerRecord::Saved { spec, .. } = &saved.scene.optimizer else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let half = f.signature.precision.is_half();
    let safe = causes::optimizer_eps::safe_eps(half);
    if let Some(eps) = spec.eps().filter(|&e| e < safe) {
        let changes = Changes {
            eps: Some(safe),
            ..Changes::default()
        };
        let fix = try_fix(
            format!("optimizer eps {eps:e} -> {safe:e}, {ON_SCENE}"),
            changes,
            true,
        )?;
        let relevance = causes::optimizer_eps::relevance(f);
        out.push(Cause::new(
            CauseKind::OptimizerEps,
            CauseKind::OptimizerEps.title().into(),
            None,
            Vec::new(),
            vec![fix],
            relevance,
        ));
    }
    // A lower rate for an update's failure, or for a trend (divergence,
    // explosion), which the steps trained after the scene's show.
    let trend = matches!(f.kind, FindingKind::Divergence | FindingKind::Explosion);
    if f.phase == Phase::Update || trend {
        let lr = spec.lr();
        let mut fixes = Vec::new();
        for decade in 1..=3 {
            let to = lr / 10f64.powi(decade);
            let changes = Changes {
                lr: Some(to),
                ..Changes::default()
            };
            fixes.push(try_fix(
                format!("learning rate {lr:e} -> {to:e}, {ON_SCENE}"),
                changes,
                true,
            )?);
        }
        let evidence = vec![format!("learning rate {lr:e}")];
        let relevance = causes::learning_rate::relevance(f);
        out.push(Cause::new(
            CauseKind::LearningRate,
            CauseKind::LearningRate.title().into(),
            None,
            evidence,
            fixes,
            relevance,
        ));
    }
    Ok(out)
}

/// Tensors without a gradient: declared frozen, the step trains the rest.
fn no_backward(f: &Finding, try_fix: &mut TryFix) -> Result<Option<Cause>> {
    let Some(cov) = &f.coverage else {
        return Ok(None);
    };
    let frozen = cov.frozen_names();
    let description = format!(
        "train only what the gradient reaches: declare the {} tensors without one frozen (a workaround; replacing the op trains them all)",
        frozen.len()
    );
    let changes = Changes {
        frozen,
        ..Changes::default()
    };
    let fix = try_fix(description, changes, true)?;
    let relevance = causes::no_backward::relevance(f);
    Ok(Some(Cause::new(
        CauseKind::NoBackward,
        CauseKind::NoBackward.title().into(),
        None,
        vec![cov.summary()],
        vec![fix],
        relevance,
    )))
}

/// Half precision, from the finding's precision check: the step re-run at
/// a higher precision passed (one step: whether it trains is not judged).
fn precision(f: &Finding) -> Option<Cause> {
    let check = f.precision.as_deref()?;
    if !f.signature.precision.is_half() || check.verdict == Robustness::NotChecked {
        return None;
    }
    let fixes = check
        .reruns
        .iter()
        .filter(|r| r.ran)
        .map(|r| Fix {
            description: format!("the step in {} (the precision check's re-run)", r.precision),
            changes: Vec::new(),
            verified: false,
            result: r.note.clone(),
            intervention: None,
            learning: None,
            workaround: false,
            diffs: Vec::new(),
            passes_step: !r.reproduced,
        })
        .collect();
    let evidence = vec![
        format!("precision {}", f.signature.precision),
        check.summary(),
    ];
    let relevance = causes::precision::relevance(f);
    Some(Cause::new(
        CauseKind::Precision,
        CauseKind::Precision.title().into(),
        None,
        evidence,
        fixes,
        relevance,
    ))
    .filter(|c: &Cause| !c.fixes.is_empty() || relevance != Relevance::Unrelated)
}
