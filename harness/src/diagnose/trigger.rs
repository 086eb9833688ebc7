//! `diagnose DIR`: a scene that carries its case — a hunt's reproducer, a
//! run's dump — diagnosed with the case's own machinery.
//!
//! Where the case fails on its own data, the scene is one of its steps:
//! the case is diagnosed as any case is (every fix trained over it). Where
//! it trains stably, the scene's step is a trigger (an input the hunt
//! built): a repair of the code is verified only when it holds on all
//! three counts — the trigger's step passes with it, the case trains with
//! it as the model as written does (within noise: the data never fires
//! the bug, so the repair must not change what it learns), and the hunt
//! re-run with it finds no trigger at the ops it rewrote within the same
//! bound. Changes to the training (a
//! rate, clipping, the data) are not judged against an input the hunt
//! built: they are left out, and the diagnosis says so.

use super::causes::{code, code_evidence, CauseKind};
use super::learning::MIN_STEPS;
use super::{rank, Cause, Diagnosis, Fix, Learning};
use crate::error::{Error, Result};
use crate::finding::{Explanation, Finding, FindingKind, Outcome, Rewrite};
use crate::hunt::{hunt, HuntOptions, RiskStatus};
use crate::intervention::Intervention;
use crate::models::{BuiltinFactory, ModelFactory};
use crate::runner::RunOptions;
use crate::scene::SavedScene;
use crate::spec::Case;
use crate::training::run_model;
use std::path::Path;
use std::sync::Arc;

/// What the trigger's diagnosis says of the causes it does not judge.
pub const NOT_JUDGED: &str = "changes to the training (a rate, clipping, clean data) are not judged against a trigger the hunt built: the case trains stably without them";

/// Diagnoses the scene in `dir` (with `case.json`): its case when the case
/// fails on its data, its trigger otherwise. `factory` builds a custom
/// model (a built-in family needs none); `hunt` bounds the re-hunts.
pub fn diagnose_dir(
    dir: &Path,
    factory: Option<&dyn ModelFactory>,
    opts: &RunOptions,
    hunt_opts: &HuntOptions,
) -> Result<Diagnosis> {
    let saved = SavedScene::load(dir)?;
    let case = saved.case.clone().ok_or_else(|| {
        Error::malformed(
            crate::error::Document::Dump,
            &dir.join(crate::scene::CASE_FILE),
            "missing: a guard's scene has no case; diagnose it in the model's binary with `nanhunt::diagnose::diagnose_scene`".to_string(),
        )
    })?;
    // A hunt's trigger records the case it searched: the repair is
    // verified over that, not over one step of a shrunk batch.
    let case = match saved.scene.origin.clone() {
        Some(mut origin) => {
            origin.resolve_paths(dir);
            origin
        }
        None => case,
    };
    let builtin = BuiltinFactory::new(&case.model);
    let factory: &dyn ModelFactory = match (factory, &builtin) {
        (Some(f), _) => f,
        (None, Some(b)) => b,
        (None, None) => {
            return Err(Error::option(
                "factory",
                format!(
                    "`{}` is a custom model: diagnose its scene with its factory",
                    case.family()
                ),
            ))
        }
    };
    let mut long = case.clone();
    long.steps = long.steps.max(MIN_STEPS);
    let runs = Counter::default();
    let baseline = match runs.run(&long, factory, opts)? {
        // Over the steps a verdict needs, the data fires it on its own.
        Outcome::Unstable { .. } => return super::diagnose(&long, factory, opts),
        Outcome::Rejected { reason } => return Err(Error::Rejected(reason)),
        stable => Learning::of(&stable),
    };
    let replayed = crate::replay::replay_scene(dir, Some(factory), opts)?;
    let reproduced = replayed.reproduced();
    let Some(finding) = replayed.actual.filter(|_| reproduced) else {
        return Err(Error::option(
            "scene",
            format!("its step does not fail here: {}", replayed.message),
        ));
    };
    let trigger = Trigger {
        dir,
        case: &long,
        factory,
        opts,
        hunt: hunt_opts,
        baseline,
        runs,
    };
    let mut causes: Vec<Cause> = finding
        .explanation
        .as_deref()
        .map(|e| trigger.code_cause(&finding, e))
        .transpose()?
        .into_iter()
        .collect();
    let supported = rank::rank(&mut causes);
    Ok(Diagnosis {
        finding: Some(finding),
        batch_raw: None,
        batch_augmented: None,
        dataset: None,
        grad_norm_growth: None,
        causes,
        supported,
        hardware: None,
        runs: trigger.runs.count.get(),
    })
}

/// Training runs spent.
#[derive(Default)]
struct Counter {
    count: std::cell::Cell<usize>,
}

impl Counter {
    fn run(&self, case: &Case, factory: &dyn ModelFactory, opts: &RunOptions) -> Result<Outcome> {
        self.count.set(self.count.get() + 1);
        run_model(case, factory, opts)
    }
}

/// A trigger's scene and what its fixes are judged against.
struct Trigger<'a> {
    dir: &'a Path,
    /// The scene's case, at least [`MIN_STEPS`] long.
    case: &'a Case,
    factory: &'a dyn ModelFactory,
    opts: &'a RunOptions,
    hunt: &'a HuntOptions,
    /// How the model as written trains on the case.
    baseline: Option<Learning>,
    runs: Counter,
}

impl Trigger<'_> {
    /// The code's cause: the rewrite of the explained op (and of the next
    /// op the trigger's step fails at), judged on all three counts; the
    /// guard of the op on the trigger's step as evidence.
    fn code_cause(&self, finding: &Finding, e: &Explanation) -> Result<Cause> {
        let mut evidence = code_evidence(finding);
        let guard = code::guard(e);
        let guarded = self.step_with(&guard)?;
        evidence.push(format!(
            "diagnostic, not a repair: {} — on the trigger's step, {}",
            guard.describe(),
            match guarded {
                None => "every check passes: the failure comes from there".to_string(),
                Some(f) => format!("it still fails ({})", f.signature.slug()),
            }
        ));
        evidence.push(NOT_JUDGED.to_string());
        let fixes = match &e.rewrite {
            Some(r) => vec![self.rewritten(e, r)?],
            None => Vec::new(),
        };
        Ok(Cause::new(
            CauseKind::CodeBug,
            code::title(e),
            None,
            evidence,
            fixes,
            code::relevance(e),
        ))
    }

    /// The trigger's step replayed with `iv` in place: its finding, if any.
    fn step_with(&self, iv: &Intervention) -> Result<Option<Finding>> {
        let opts = with(self.opts, iv);
        self.runs.count.set(self.runs.count.get() + 1);
        Ok(crate::replay::replay_scene(self.dir, Some(self.factory), &opts)?.actual)
    }

    /// The rewrites that repair the trigger (`first` and those of the ops
    /// its step fails at next, up the eps ladder: [`code::search`]),
    /// judged: the step passes, the case learns, the re-hunt is quiet.
    fn rewritten(&self, e: &Explanation, first: &Rewrite) -> Result<Fix> {
        let (set, result) = code::search(first, |set| self.attempt(e, set))?;
        let (verified, passes_step, learning, result) = result;
        Ok(Fix {
            description: Intervention::rewrite(&e.stage, set.clone()).describe(),
            changes: Vec::new(),
            verified,
            result,
            intervention: Some(Intervention::rewrite(&e.stage, set.clone())),
            learning,
            workaround: false,
            diffs: crate::finding::line_diffs(&set),
            passes_step,
        })
    }

    /// The trigger's step, the case and the hunt with `set` in place.
    fn attempt(&self, e: &Explanation, set: &[Rewrite]) -> Result<code::Attempt<Judged>> {
        let iv = Intervention::rewrite(&e.stage, set.to_vec());
        let attempt = |passed, next, result: Judged| code::Attempt {
            passed,
            next,
            result,
        };
        let step = self.step_with(&iv)?;
        // A finite loss that jumps on an input far outside the data (a
        // divergence, an explosion) is not the op's failure.
        let jumped = step
            .as_ref()
            .is_some_and(|f| matches!(f.kind, FindingKind::Divergence | FindingKind::Explosion));
        if let Some(f) = step.as_ref().filter(|_| !jumped) {
            let next = f.explanation.as_deref().and_then(|x| x.rewrite.clone());
            let said = format!("the trigger's step still fails: {}", f.signature.slug());
            return Ok(attempt(false, next, (false, false, None, said)));
        }
        let step_said = match jumped {
            true => "the trigger's step computes finite values (its loss jumps, on an input the hunt built)",
            false => "the trigger's step passes",
        };
        let outcome = self
            .runs
            .run(self.case, self.factory, &with(self.opts, &iv))?;
        let Some(learning) = Learning::of(&outcome) else {
            let said = format!(
                "{step_said}; the case with it: {}",
                super::context::result_text(&outcome)
            );
            let next = match &outcome {
                Outcome::Unstable { finding } => finding
                    .explanation
                    .as_deref()
                    .and_then(|x| x.rewrite.clone()),
                _ => None,
            };
            return Ok(attempt(false, next, (false, true, None, said)));
        };
        let baseline = self.baseline.unwrap_or(learning);
        // The case never fires the bug: the repair must leave its
        // training as it was, learning or not.
        let unchanged = learning.unchanged_from(&baseline);
        let quiet = match unchanged {
            true => self.quiet(&iv, set)?,
            false => Some("not re-hunted".to_string()),
        };
        let verified = unchanged && quiet.is_none();
        let trains = match (unchanged, learning.learns_on_its_own()) {
            (true, true) => "stable and learning, as the model as written does",
            (true, false) => {
                "stable, training as the model as written does (neither learns by the margin)"
            }
            (false, _) => "stable, but training otherwise than the model as written does",
        };
        let said = format!(
            "{step_said}; on the case over {} steps, {trains}: loss {:.4} -> {:.4}, smoothed over the last steps (as written: {:.4} -> {:.4}); {}",
            learning.steps,
            learning.first_loss,
            learning.final_loss,
            baseline.first_loss,
            baseline.final_loss,
            quiet.unwrap_or_else(|| format!(
                "re-hunted within {}× the data's scale: no trigger at the ops it rewrote",
                self.hunt.bound()
            ))
        );
        Ok(attempt(
            verified,
            None,
            (verified, true, Some(learning), said),
        ))
    }

    /// `None` when the hunt with `iv` in place triggers none of `set`'s
    /// ops; otherwise what it found there.
    fn quiet(&self, iv: &Intervention, set: &[Rewrite]) -> Result<Option<String>> {
        let mut opts = self.hunt.clone();
        opts.run = with(self.opts, iv);
        opts.out = None;
        let report = hunt(self.case, self.factory, &opts)?;
        let fired = report.stages.iter().find(|s| {
            matches!(
                s.status,
                RiskStatus::Triggered(_) | RiskStatus::FiredOnData { .. }
            ) && s
                .site
                .as_ref()
                .is_some_and(|site| set.iter().any(|r| r.site.location() == site.location()))
        });
        Ok(fired.map(|s| format!("re-hunted: still triggered at `{}`", s.stage)))
    }
}

/// A rewrite set's verdict: verified, whether the trigger's step passed,
/// how the case trained, and the line that says so.
type Judged = (bool, bool, Option<Learning>, String);

/// `opts` with `iv` in place.
fn with(opts: &RunOptions, iv: &Intervention) -> RunOptions {
    RunOptions {
        intervention: Some(Arc::new(iv.clone())),
        dump: None,
        dump_at: None,
        ..opts.clone()
    }
}
