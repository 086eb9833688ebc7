//! The record of one training run: how it ended (a typed [`Verdict`]), its
//! signature and failing step, its losses. Made once from an [`Outcome`]
//! (or from the way a worker died) and carried unchanged to the journal,
//! the report and `summary.json`.

use crate::finding::{Outcome, Signature, Verdict};
use serde::{Deserialize, Serialize};

/// The record of one run, as journaled (and sent by worker processes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// How it ended.
    pub verdict: Verdict,
    /// An unstable run's signature.
    pub signature: Option<Signature>,
    /// An unstable run's failing step.
    pub step: Option<usize>,
    /// The loss of each step, rounded to f32.
    #[serde(with = "crate::floats::vec")]
    pub losses: Vec<f64>,
    /// What went wrong, for errors and panics.
    pub message: Option<String>,
    /// An unstable run's precision check verdict ([`crate::fidelity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<crate::finding::Robustness>,
    /// What the producing stage did, where it was explained ([`crate::explain`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<crate::finding::Pattern>,
}

impl RunResult {
    /// The record of a run that ended in an [`Outcome`]; losses rounded to
    /// f32 (for the report's curves), as the journal keeps them.
    pub fn of(outcome: &Outcome) -> RunResult {
        let (signature, step, message) = match outcome {
            Outcome::Stable { .. } => (None, None, None),
            Outcome::Unstable { finding } => {
                (Some(finding.signature.clone()), Some(finding.step), None)
            }
            Outcome::Rejected { reason } => (None, None, Some(reason.clone())),
        };
        RunResult {
            verdict: outcome.verdict(),
            signature,
            step,
            losses: outcome
                .trace()
                .map(|t| t.losses.iter().map(|&l| l as f32 as f64).collect())
                .unwrap_or_default(),
            message,
            fidelity: match outcome {
                Outcome::Unstable { finding } => finding.precision.as_ref().map(|p| p.verdict),
                _ => None,
            },
            pattern: outcome
                .finding()
                .and_then(|f| f.explanation.as_ref())
                .map(|e| e.pattern),
        }
    }
}
