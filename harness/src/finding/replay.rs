//! What a replay found: a scene's step or a reproducer's case run again,
//! against the signature it recorded.

use super::{Finding, Signature};
use serde::Serialize;

/// What a replay showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReplayVerdict {
    /// The recorded signature came back.
    Reproduced,
    /// The case now trains stably: whatever caused the failure is fixed.
    Fixed,
    /// It still fails, but differently.
    Different,
}

/// A replay's result, against what was recorded.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    /// What it showed.
    pub verdict: ReplayVerdict,
    /// The recorded signature; `None` for a healthy step's dump.
    pub expected: Option<Signature>,
    /// The recorded failing step.
    pub expected_step: usize,
    /// The failure seen now, if any.
    pub actual: Option<Finding>,
    /// Dumps only: whether the failing step's loss has the recorded bits.
    pub bit_identical: Option<bool>,
    /// Dumps only: whether two runs of the step's loss gave the same bits
    /// when the scene was written (`false`: the model draws random numbers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deterministic: Option<bool>,
    /// The verdict in words.
    pub message: String,
}

/// How to make a model that draws random numbers replay: the seeded
/// dropout and initialization nanhunt ships.
pub const SEED_THEM: &str =
    "seed them: nanhunt::models::seeded::Dropout for dropout, seeded::var_builder for the initialization";

impl ReplayReport {
    /// A report from what was expected and what was seen.
    pub fn new(
        expected: Option<Signature>,
        expected_step: usize,
        actual: Option<Finding>,
        bit_identical: Option<bool>,
    ) -> Self {
        let verdict = match (&expected, &actual) {
            (None, None) => ReplayVerdict::Reproduced,
            (Some(_), None) => ReplayVerdict::Fixed,
            (Some(e), Some(f)) if f.signature == *e && f.step == expected_step => {
                ReplayVerdict::Reproduced
            }
            (_, Some(_)) => ReplayVerdict::Different,
        };
        let recorded = expected
            .as_ref()
            .map_or_else(|| "a healthy step".to_string(), |e| e.to_string());
        let message = match (&verdict, &actual) {
            (ReplayVerdict::Reproduced, _) if bit_identical == Some(false) => format!(
                "not bit-identical: {recorded} came back at step {expected_step}, but the step's loss differs from the recorded one (the model draws random numbers, or its state was not restored exactly)"
            ),
            (ReplayVerdict::Reproduced, _) => format!("reproduced: {recorded} at step {expected_step}"),
            (ReplayVerdict::Fixed, _) => format!(
                "no longer fails: expected {recorded} at step {expected_step}, but training stayed stable (fixed?)"
            ),
            (_, Some(f)) => format!(
                "fails differently: expected {recorded} at step {expected_step}, got {} at step {}",
                f.signature, f.step
            ),
            (_, None) => unreachable!("a different failure has a finding"),
        };
        ReplayReport {
            verdict,
            expected,
            expected_step,
            actual,
            bit_identical,
            deterministic: None,
            message,
        }
    }

    /// The report with what the scene recorded of the model's randomness:
    /// a replay that is not bit-identical says why.
    pub fn with_determinism(mut self, deterministic: Option<bool>) -> Self {
        self.deterministic = deterministic;
        let recorded = self
            .expected
            .as_ref()
            .map_or_else(|| "a healthy step".to_string(), |e| e.to_string());
        let step = self.expected_step;
        let random = format!("the model draws random numbers (two runs of the step's loss differed when the scene was written; {SEED_THEM})");
        match (self.verdict, self.bit_identical, deterministic) {
            (ReplayVerdict::Reproduced, Some(false), Some(false)) => {
                self.message =
                    format!("not bit-identical: {random}; {recorded} came back at step {step}");
            }
            (ReplayVerdict::Reproduced, Some(false), Some(true)) => {
                self.message = format!(
                    "not bit-identical: {recorded} came back at step {step}, but the step's loss differs from the recorded one, although two runs of it agreed when the scene was written (its state was not restored exactly)"
                );
            }
            (ReplayVerdict::Fixed | ReplayVerdict::Different, _, Some(false)) => {
                self.message = format!("{}; {random}", self.message);
            }
            _ => {}
        }
        self
    }

    /// Whether the recorded signature came back.
    pub fn reproduced(&self) -> bool {
        self.verdict == ReplayVerdict::Reproduced && self.bit_identical != Some(false)
    }
}
