//! What every cause reads ([`Context`]: the case, the finding and the
//! evidence gathered once) and how its candidate fixes are run ([`Runs`]:
//! a changed case trained with the caller's factory and options, counted,
//! with the differential's arms standing in for the device and thread
//! variants they already ran).

use super::{BatchScan, CauseKind, Fix, Learning};
use crate::differential::{ArmRun, Differential};
use crate::error::Result;
use crate::finding::{Finding, Outcome};
use crate::models::ModelFactory;
use crate::runner::RunOptions;
use crate::spec::{case_diff, Case};
use crate::training::run_model;

/// The failure being diagnosed and the evidence gathered about it.
pub(super) struct Context<'a> {
    /// The case as run (on its device, its dataset pinned).
    pub case: &'a Case,
    pub finding: &'a Finding,
    /// Step 2: the failing batch before and after augmentation.
    pub raw: &'a BatchScan,
    pub augmented: &'a BatchScan,
    /// Step 2 over a dataset: its scan, and the samples it flags.
    pub dataset: Option<&'a crate::data::scan::DataScan>,
    pub bad_samples: &'a [usize],
    /// Step 3: the gradient norm's growth over the run (last / first).
    pub growth: Option<f64>,
}

impl Context<'_> {
    /// "the failure is nan in forward at `stage`".
    pub fn at(&self) -> String {
        let f = self.finding;
        format!(
            "the failure is {} in {} at `{}`",
            f.kind.as_str(),
            f.phase.as_str(),
            f.stage
        )
    }
}

/// A candidate fix: a changed case that would rule its cause in or out.
pub(super) struct Variant {
    pub description: String,
    pub case: Case,
    /// Run under a one-thread pool.
    pub one_thread: bool,
}

/// `base` changed by `change`, described.
pub(super) fn variant(
    description: impl Into<String>,
    base: &Case,
    change: impl FnOnce(&mut Case),
) -> Variant {
    let mut case = base.clone();
    change(&mut case);
    Variant {
        description: description.into(),
        case,
        one_thread: false,
    }
}

/// Runs candidate fixes and counts the training runs spent.
pub(super) struct Runs<'a> {
    pub factory: &'a dyn ModelFactory,
    /// The options fixes run with (no dump, no precision check).
    pub opts: RunOptions,
    /// Step 5's differential, whose arms answer the device and thread variants.
    pub hardware: &'a Differential,
    pub count: usize,
}

impl Runs<'_> {
    /// A case trained once: its outcome.
    pub fn outcome(&mut self, case: &Case) -> Result<Outcome> {
        self.count += 1;
        run_model(case, self.factory, &self.opts)
    }

    /// The variant of a `kind` cause run (or read from the arm that
    /// already ran it), as a fix of `base`.
    pub fn fix(&mut self, kind: CauseKind, v: &Variant, base: &Case) -> Result<Fix> {
        let (verified, result, learning) = match arm_for(kind, v, self.hardware) {
            Some(arm) => (
                arm.verdict == crate::finding::Verdict::Stable,
                arm_text(arm),
                None,
            ),
            None => {
                let outcome = if v.one_thread {
                    self.count += 1;
                    let (factory, opts) = (self.factory, &self.opts);
                    crate::device::cpu_pool(1)?.install(|| run_model(&v.case, factory, opts))?
                } else {
                    self.outcome(&v.case)?
                };
                (
                    matches!(outcome, Outcome::Stable { .. }),
                    result_text(&outcome),
                    Learning::of(&outcome),
                )
            }
        };
        Ok(Fix {
            description: v.description.clone(),
            changes: case_diff(base, &v.case),
            verified,
            result,
            intervention: None,
            learning,
            workaround: false,
            diffs: Vec::new(),
            passes_step: false,
        })
    }
}

/// The differential arm that already ran a variant's case: the one-thread
/// arm, or the arm on the variant's device.
fn arm_for<'d>(kind: CauseKind, v: &Variant, hardware: &'d Differential) -> Option<&'d ArmRun> {
    hardware.arms.iter().find(|a| {
        if v.one_thread {
            a.threads == Some(1)
        } else {
            kind == CauseKind::Device && a.threads.is_none() && a.device == v.case.device
        }
    })
}

fn arm_text(a: &ArmRun) -> String {
    match &a.signature {
        Some(s) => format!("unstable: {}", s.slug()),
        None => "stable".into(),
    }
}

/// `stable`, `unstable: <signature>` or `rejected: <reason>`.
pub(super) fn result_text(o: &Outcome) -> String {
    match o {
        Outcome::Stable { .. } => "stable".into(),
        Outcome::Unstable { finding } => format!("unstable: {}", finding.signature.slug()),
        Outcome::Rejected { reason } => format!("rejected: {reason}"),
    }
}
