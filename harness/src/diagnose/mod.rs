//! `diagnose`: the source article's five steps as an engine.
//!
//! 1. Reproduce the failure (and dump the scene).
//! 2. Scan the failing batch; re-run without augmentation and with clean data.
//! 3. Read the gradient-norm history; re-run with a lower LR and with clipping.
//! 4. Re-run with the stable variant of the loss and with larger eps values.
//! 5. Re-run in f32, on CPU, with one thread (and on the other device when
//!    built with CUDA).
//!
//! Every candidate cause comes with the changed cases that were run, each
//! trained over the case (at least [`MIN_STEPS`] steps); a fix is
//! *verified* only when its case trained stably and learned (`learning.rs`:
//! its smoothed loss fell by [`FALL`] of its first, its gradients not
//! zero, and no fix from the same start trained far better), and a
//! fix that only removes the trigger is a workaround. Each cause lives in a file
//! of its own under `causes/` with its candidates, its evidence and its
//! relevance; `rank.rs` orders them: a verified fix first, then how well
//! the cause fits where the failure was produced.

mod batch;
mod causes;
mod context;
mod learning;
mod rank;
mod scene;
mod trigger;

pub use crate::spec::{case_diff, FieldChange};
pub use batch::{BatchScan, EXTREME};
pub use causes::{stable_loss, CauseKind, KNOB_CANDIDATES, LR_SEARCH_DECADES};
pub use learning::{Learning, DROP_TOLERANCE, FALL, FLOOR_TOLERANCE, MIN_STEPS};
pub use scene::{diagnose_scene, ONE_STEP};
pub use trigger::{diagnose_dir, NOT_JUDGED};

use crate::differential::{compare, Arms, Differential, Tolerance};
use crate::error::Result;
use crate::finding::{Finding, FindingKind, Outcome};
use crate::models::ModelFactory;
use crate::runner::RunOptions;
use crate::spec::{Case, DeviceSpec};
use crate::training::run_model;
use context::{Context, Runs};
use rank::{rank, Relevance};
use serde::Serialize;

pub use causes::INPUT_SCALE;

/// A changed case and what happened when it ran.
#[derive(Clone, Debug, Serialize)]
pub struct Fix {
    /// What the fix changes, in words.
    pub description: String,
    /// The case fields it changes.
    pub changes: Vec<FieldChange>,
    /// The changed case trained stably and learned.
    pub verified: bool,
    /// `stable`, or the signature it failed with.
    pub result: String,
    /// The stage an intervention guarded, for a fix that changes no field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intervention: Option<crate::intervention::Intervention>,
    /// How its run trained, when it stayed stable over a whole case.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learning: Option<Learning>,
    /// It only removes the failure's trigger (a lower rate for a NaN the
    /// code makes, a smaller init, cleaning clean data): it ranks below a
    /// verified repair of the code.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub workaround: bool,
    /// A rewrite's diffs of the user's source lines.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub diffs: Vec<crate::finding::LineDiff>,
    /// The failing step replayed with it passed every check (a scene's
    /// fix: one step, so whether it trains is not judged).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub passes_step: bool,
}

/// A candidate root cause with its evidence and the fixes that were tried.
#[derive(Clone, Debug, Serialize)]
pub struct Cause {
    /// What it is.
    pub kind: CauseKind,
    /// Its title in reports.
    pub title: String,
    /// The declared knob a `model_knob` cause turns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub knob: Option<String>,
    /// The source article's step it belongs to (1–5).
    pub article_step: u8,
    /// What points at it.
    pub evidence: Vec<String>,
    /// The fixes tried, best first.
    pub fixes: Vec<Fix>,
    /// How it ranks (higher first).
    pub score: i32,
    /// How well it fits the failure (the score without its fixes).
    #[serde(skip)]
    relevance: Relevance,
}

impl Cause {
    /// A cause with its evidence and the fixes it tried; its score from
    /// its relevance to the failure and whether a fix was verified.
    pub(crate) fn new(
        kind: CauseKind,
        title: String,
        knob: Option<String>,
        evidence: Vec<String>,
        fixes: Vec<Fix>,
        relevance: Relevance,
    ) -> Cause {
        let verified = fixes.iter().any(|f| f.verified);
        Cause {
            kind,
            title,
            knob,
            article_step: kind.article_step(),
            evidence,
            fixes,
            score: relevance.score(verified),
            relevance,
        }
    }

    /// Whether one of its fixes is verified.
    pub fn verified(&self) -> bool {
        self.fixes.iter().any(|f| f.verified)
    }

    /// A fix with which the failing step passed every check.
    pub fn passes_step(&self) -> bool {
        self.fixes.iter().any(|f| f.passes_step)
    }

    /// A verified fix that repairs the code, not only its trigger.
    pub fn repaired(&self) -> bool {
        self.fixes.iter().any(|f| f.verified && !f.workaround)
    }

    /// The score again after its fixes were judged.
    fn rescore(&mut self) {
        self.score = self.relevance.score(self.verified());
    }

    /// This cause as unrelated to the failure, whatever its fixes did.
    fn unrelate(&mut self) {
        self.relevance = Relevance::Unrelated;
        self.rescore();
    }
}

/// What `diagnose` found: the evidence of the five steps and the causes, ranked.
#[derive(Clone, Debug, Serialize)]
pub struct Diagnosis {
    /// The failure being diagnosed; `None` when the case trained stably.
    pub finding: Option<Finding>,
    /// Step 2: the failing batch before and after augmentation.
    pub batch_raw: Option<BatchScan>,
    /// Step 2: the failing batch after augmentation.
    pub batch_augmented: Option<BatchScan>,
    /// Step 2 over the whole dataset (cases that draw from one): the scan
    /// of every sample the case draws.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<crate::data::scan::DataScan>,
    /// Step 3: the gradient norm's growth over the run, last / first.
    pub grad_norm_growth: Option<f64>,
    /// Ranked, best explanation first.
    pub causes: Vec<Cause>,
    /// How many of the first causes are supported: a verified fix, or
    /// evidence at the failure's site. The rest were tried and ruled out;
    /// with 0, nothing explains the failure yet.
    pub supported: usize,
    /// Step 5: the case compared step by step across devices (CPU and
    /// CUDA, when CUDA is compiled in) or else across thread counts.
    pub hardware: Option<crate::differential::Differential>,
    /// Training runs spent, the reproduction included.
    pub runs: usize,
}

impl Diagnosis {
    /// The causes with a verified fix.
    pub fn verified_causes(&self) -> impl Iterator<Item = &Cause> {
        self.causes.iter().filter(|c| c.verified())
    }
}

/// Diagnoses a case: reproduces it (dumping the scene when `opts.dump` is
/// set), gathers evidence and runs every cause's candidate fixes.
///
/// ```no_run
/// use nanhunt::models::BuiltinFactory;
/// let case = nanhunt::Case::example("cnn").expect("a built-in family");
/// let factory = BuiltinFactory::new(&case.model).expect("a built-in family");
/// let d = nanhunt::diagnose::diagnose(&case, &factory, &nanhunt::RunOptions::default())?;
/// for cause in d.verified_causes() {
///     println!("{}", cause.title);
/// }
/// # Ok::<(), nanhunt::Error>(())
/// ```
pub fn diagnose(case: &Case, factory: &dyn ModelFactory, opts: &RunOptions) -> Result<Diagnosis> {
    let finding = match run_model(case, factory, opts)? {
        Outcome::Unstable { finding } => *finding,
        Outcome::Rejected { reason } => return Err(crate::error::Error::Rejected(reason)),
        Outcome::Stable { .. } => return Ok(Diagnosis::stable()),
    };
    let mut case = crate::data::pinned(&case.on(opts.device), opts.limits.max_memory_bytes)?;
    let evidence = Evidence::gather(&case, &finding, opts)?;
    // Every fix trains long enough for its learning to be judged.
    case.steps = case.steps.max(learning::MIN_STEPS);
    let run_opts = RunOptions {
        dump: None,
        dump_at: None,
        device: None,
        fidelity: false,
        ..opts.clone()
    };
    // Step 5, differential: where do devices (or thread counts) part ways?
    // Its arms also answer the device and thread variants.
    let hardware = differential(&case, factory, &run_opts)?;
    let mut runs = Runs {
        factory,
        opts: run_opts,
        hardware: &hardware,
        count: 1 + hardware.arms.len(),
    };
    let bad = evidence
        .dataset
        .as_ref()
        .map(crate::data::scan::DataScan::bad_samples)
        .unwrap_or_default();
    let ctx = Context {
        case: &case,
        finding: &finding,
        raw: &evidence.raw,
        augmented: &evidence.augmented,
        dataset: evidence.dataset.as_ref(),
        bad_samples: &bad,
        growth: evidence.growth,
    };
    let mut causes = Vec::new();
    for rule in causes::RULES.iter().filter(|r| r.explains(finding.phase)) {
        causes.extend(rule.causes(&ctx, &mut runs)?);
    }
    // Only the cut explains tensors without a gradient.
    if finding.kind == FindingKind::NoGradient {
        for c in causes
            .iter_mut()
            .filter(|c| c.kind != CauseKind::NoBackward)
        {
            c.unrelate();
        }
    }
    let raw = &evidence.raw;
    let data_clean =
        raw.nan + raw.inf + raw.extreme + raw.labels_out_of_range == 0 && bad.is_empty();
    learning::judge(&mut causes, &finding, data_clean);
    let supported = rank(&mut causes);
    let runs = runs.count;
    Ok(Diagnosis {
        hardware: Some(hardware),
        finding: Some(finding),
        dataset: evidence.dataset,
        batch_raw: Some(evidence.raw),
        batch_augmented: Some(evidence.augmented),
        grad_norm_growth: evidence.growth,
        causes,
        supported,
        runs,
    })
}

impl Diagnosis {
    /// The diagnosis of a case that trained stably: nothing to explain.
    fn stable() -> Diagnosis {
        Diagnosis {
            finding: None,
            dataset: None,
            batch_raw: None,
            batch_augmented: None,
            grad_norm_growth: None,
            causes: Vec::new(),
            supported: 0,
            hardware: None,
            runs: 1,
        }
    }
}

/// Steps 2 and 3's evidence, gathered once for every cause.
struct Evidence {
    raw: BatchScan,
    augmented: BatchScan,
    dataset: Option<crate::data::scan::DataScan>,
    growth: Option<f64>,
}

impl Evidence {
    /// The failing step's batch before and after augmentation, every sample
    /// of a dataset the case draws from, and the gradient norm's growth.
    fn gather(case: &Case, finding: &Finding, opts: &RunOptions) -> Result<Evidence> {
        let max = opts.limits.max_memory_bytes;
        let source = crate::data::open_source(case, opts.dataset.as_ref(), max)?;
        let mut raw = source.batch(finding.step, case.batch_size)?;
        crate::data::apply_pathologies(&mut raw, &case.data.pathologies, case.seed, finding.step);
        let dataset = match (source.dataset(), case.data.source.sampling()) {
            (Some(d), Some(sampling)) => {
                let drawn = crate::data::kept_samples(sampling, d.len())
                    .map_err(|r| crate::error::Error::invalid("data.source.sampling", r))?;
                let opts = crate::data::scan::ScanOptions {
                    classes: Some(case.model.classes()),
                    extreme: EXTREME,
                    max_listed: usize::MAX,
                    max_memory: max,
                    threads: 1,
                };
                Some(crate::data::scan::scan_dataset(&**d, Some(&drawn), &opts)?)
            }
            _ => None,
        };
        let mut augmented = raw.clone();
        crate::augment::apply_all(&mut augmented, &case.augment, case.seed, finding.step);
        let norms: Vec<f64> = finding
            .trace
            .grad_norms
            .iter()
            .copied()
            .filter(|n| n.is_finite())
            .collect();
        let growth = match (norms.first(), norms.last()) {
            (Some(&a), Some(&b)) if norms.len() > 1 && a > 0.0 => Some(b / a),
            _ => None,
        };
        Ok(Evidence {
            raw: BatchScan::of(&raw),
            augmented: BatchScan::of(&augmented),
            dataset,
            growth,
        })
    }
}

/// The case compared step by step across devices (CPU and CUDA, when CUDA
/// is usable) or else across thread counts.
fn differential(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
) -> Result<Differential> {
    let arms = match case.device {
        DeviceSpec::Cuda(i) => Arms::Devices(vec![DeviceSpec::Cpu, DeviceSpec::Cuda(i)]),
        DeviceSpec::Cpu if crate::device::cuda_usable() => {
            Arms::Devices(vec![DeviceSpec::Cpu, DeviceSpec::Cuda(0)])
        }
        DeviceSpec::Cpu => {
            let n = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
            Arms::Threads(vec![1, n])
        }
    };
    compare(
        case,
        Some(factory),
        &arms,
        Tolerance::default_for(&arms, case),
        opts,
    )
}

/// The gradient norm's change over the run (last / first), in words that
/// say which way it went.
pub fn growth_phrase(g: f64) -> String {
    if g >= 1.0 {
        format!("the gradient norm grew {g:.3e}x before the failure")
    } else {
        format!("the gradient norm fell to {g:.3e} of its first value before the failure (it did not grow)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ClipSpec, Pathology};

    #[test]
    fn diff_names_changed_fields_only() {
        let a = Case::example("cnn").unwrap();
        let mut b = a.clone();
        b.optimizer.set_lr(1e-4);
        b.clip = ClipSpec::Norm { max_norm: 1.0 };
        let d = case_diff(&a, &b);
        let paths: Vec<&str> = d.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, vec!["clip", "optimizer.lr"]);
    }

    fn cause(kind: CauseKind, score: i32, verified: bool) -> Cause {
        Cause {
            kind,
            title: kind.title().into(),
            knob: None,
            article_step: kind.article_step(),
            evidence: Vec::new(),
            fixes: vec![Fix {
                description: String::new(),
                changes: Vec::new(),
                verified,
                result: String::new(),
                intervention: None,
                learning: None,
                workaround: false,
                diffs: Vec::new(),
                passes_step: false,
            }],
            score,
            relevance: Relevance::Unrelated,
        }
    }

    #[test]
    fn a_cause_without_evidence_or_a_verified_fix_never_ranks_first() {
        // Scores as diagnose gives them: unverified guesses away from the
        // failure's site (an LR for a forward NaN: 10, clipping: 20), the
        // unverified loss cause at its site (60).
        let mut causes = vec![
            cause(CauseKind::LearningRate, 10, false),
            cause(CauseKind::NoClipping, 20, false),
            cause(CauseKind::UnsafeLoss, 60, false),
        ];
        assert_eq!(rank(&mut causes), 1);
        assert_eq!(causes[0].kind, CauseKind::UnsafeLoss);
        // Nothing supported: the list says so (no cause leads it).
        let mut guesses = vec![
            cause(CauseKind::LearningRate, 25, false),
            cause(CauseKind::InitScale, 30, false),
        ];
        assert_eq!(rank(&mut guesses), 0);
        // Verified fixes and an explained code bug, by score.
        let mut causes = vec![
            cause(CauseKind::InitScale, 30, false),
            cause(CauseKind::LearningRate, 110, true),
            cause(CauseKind::CodeBug, 175, true),
        ];
        assert_eq!(rank(&mut causes), 2);
        let kinds: Vec<CauseKind> = causes.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                CauseKind::CodeBug,
                CauseKind::LearningRate,
                CauseKind::InitScale
            ]
        );
        // A verified workaround ranks below a verified repair, whatever the scores.
        let mut lower_rate = cause(CauseKind::LearningRate, 160, true);
        lower_rate.fixes[0].workaround = true;
        let mut causes = vec![lower_rate, cause(CauseKind::OptimizerEps, 120, true)];
        assert_eq!(rank(&mut causes), 2);
        assert_eq!(causes[0].kind, CauseKind::OptimizerEps);
    }

    #[test]
    fn the_gradient_norm_evidence_says_which_way_it_went() {
        assert!(growth_phrase(12.0).contains("grew 1.200e1x"));
        let fell = growth_phrase(0.3282);
        assert!(
            fell.contains("fell to 3.282e-1") && !fell.contains("grew"),
            "{fell}"
        );
    }

    #[test]
    fn batch_scan_sees_constant_features_and_zero_samples() {
        let mut c = Case::example("cnn").unwrap();
        c.data.pathologies = vec![
            Pathology::ConstantFeature {
                feature: 2,
                value: 0.0,
                from_step: 0,
            },
            Pathology::AllZero {
                fraction: 0.25,
                from_step: 0,
            },
        ];
        let b = crate::data::Generator::new(&c).data_batch(0, 8);
        let s = BatchScan::of(&b);
        assert_eq!(s.constant_features, vec![2]);
        assert_eq!(s.all_zero_samples, 2);
    }
}
