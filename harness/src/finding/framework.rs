//! A finding's framework mark as the finding carries it: would PyTorch,
//! running the same step with its own numerics, fail too — or does the
//! finding hang on one of the rules where candle differs
//! (`docs/NUMERICS.md`)? [`crate::fidelity`] runs the step again with
//! PyTorch's half-precision rounding and reads the rule from the finding.

use super::{Finding, FindingKind, OpKind, Pattern, Phase, PrecisionCheck, Rerun, Robustness};
use crate::spec::PrecisionKind;
use serde::{Deserialize, Serialize};

/// What the framework check says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FrameworkVerdict {
    /// The same step fails with PyTorch's numerics too.
    FailsToo,
    /// The finding hinges on a rule of candle's that PyTorch does not share.
    CandleSpecific,
    /// The check could not tell (its note says why).
    NotJudged,
}

/// A place where candle's numerics differ from PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CandleRule {
    /// Half-precision sums, means and products accumulate in the half
    /// dtype (PyTorch accumulates in f32).
    HalfAccumulation,
    /// A norm's statistics (and their backward sums) in the half dtype.
    HalfNormStatistics,
    /// The square-root backward divides before it halves, (g/√x)·0.5.
    SqrtBackward,
    /// `affine` rounds its multiplier to the half dtype first: `f32::MIN`
    /// is −inf and a masked 0 · (−inf) is NaN.
    HalfAffine,
    /// Some other intermediate inside a stage computed in the half dtype
    /// (PyTorch computes each op in f32 and rounds its result).
    HalfIntermediate,
    /// A gradient exactly 0.0 where another summation order leaves noise.
    ExactZeros,
    /// A softmax over a fully masked row: NaN in candle and in PyTorch's
    /// plain softmax; PyTorch's `scaled_dot_product_attention` returns
    /// zeros. Kept to read earlier findings: a masked row is now marked
    /// "PyTorch would fail too", naming the plain softmax it speaks for.
    FullyMaskedRow,
}

impl FrameworkVerdict {
    /// The verdict as reports give it.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameworkVerdict::FailsToo => "PyTorch would fail too",
            FrameworkVerdict::CandleSpecific => "candle-specific",
            FrameworkVerdict::NotJudged => "not judged against PyTorch",
        }
    }
}

impl CandleRule {
    /// The rule as reports give it.
    pub fn as_str(self) -> &'static str {
        match self {
            CandleRule::HalfAccumulation => "half-precision accumulation",
            CandleRule::HalfNormStatistics => "half-precision norm statistics",
            CandleRule::SqrtBackward => "the square-root backward's order",
            CandleRule::HalfAffine => "affine's multiplier rounded to the half dtype",
            CandleRule::HalfIntermediate => "a half-precision intermediate inside the stage",
            CandleRule::ExactZeros => "exact zeros",
            CandleRule::FullyMaskedRow => "a fully masked row",
        }
    }

    /// What PyTorch does instead, for the note.
    fn pytorch(self) -> &'static str {
        match self {
            CandleRule::HalfAccumulation | CandleRule::HalfNormStatistics => {
                "PyTorch accumulates half-precision reductions in f32"
            }
            CandleRule::SqrtBackward => "PyTorch computes g/(2√x)",
            CandleRule::HalfAffine => "PyTorch multiplies in f32: (1 − keep) · f32::MIN is −0",
            CandleRule::HalfIntermediate => {
                "PyTorch computes each op in f32 and rounds only its result"
            }
            CandleRule::ExactZeros => "PyTorch's summation order leaves ±1e-11 of noise there",
            CandleRule::FullyMaskedRow => {
                "PyTorch's scaled_dot_product_attention returns zeros for the row; its plain softmax gives NaN too"
            }
        }
    }
}

/// A finding's framework mark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrameworkMark {
    /// Whether PyTorch would fail too, and why.
    pub verdict: FrameworkVerdict,
    /// The rule a candle-specific finding hinges on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<CandleRule>,
    /// The evidence, in one sentence.
    pub note: String,
}

impl FrameworkMark {
    /// One line for reports: `candle-specific: exact zeros — <evidence>`.
    pub fn summary(&self) -> String {
        match self.rule {
            Some(rule) => format!(
                "{}: {} — {}",
                self.verdict.as_str(),
                rule.as_str(),
                self.note
            ),
            None => format!("{} — {}", self.verdict.as_str(), self.note),
        }
    }

    fn fails_too(note: impl Into<String>) -> FrameworkMark {
        FrameworkMark {
            verdict: FrameworkVerdict::FailsToo,
            rule: None,
            note: note.into(),
        }
    }

    fn specific(rule: CandleRule, evidence: &str) -> FrameworkMark {
        FrameworkMark {
            verdict: FrameworkVerdict::CandleSpecific,
            rule: Some(rule),
            note: format!("{evidence}; {}", rule.pytorch()),
        }
    }

    fn not_judged(note: impl Into<String>) -> FrameworkMark {
        FrameworkMark {
            verdict: FrameworkVerdict::NotJudged,
            rule: None,
            note: note.into(),
        }
    }

    /// The mark of `finding` from its precision check and, for a
    /// half-precision case, the re-run of its step with PyTorch's rounding
    /// (`emulated`: every stage computed in f32 and its output and
    /// gradient stored in the half dtype; `None` for an f32 or f64 case).
    pub fn of(
        finding: &Finding,
        check: &PrecisionCheck,
        emulated: Option<&Rerun>,
    ) -> FrameworkMark {
        if check.verdict == Robustness::HangsOnExactZeros {
            return exact_zeros(check);
        }
        let masked = finding
            .explanation
            .as_ref()
            .is_some_and(|e| matches!(e.pattern, Pattern::MaskedRow | Pattern::MaskInsideSoftmax));
        let Some(run) = emulated else {
            if masked && check.verdict == Robustness::ReproducesInF64 {
                return FrameworkMark::fails_too(MASKED_ROW);
            }
            return match check.verdict {
                Robustness::ReproducesInF64 => FrameworkMark::fails_too(
                    "at f32 and f64 candle computes as PyTorch does, up to the rules docs/NUMERICS.md lists, and none applies",
                ),
                Robustness::NotChecked => {
                    FrameworkMark::not_judged("the step was not re-run at a higher precision")
                }
                // A NaN in an f32 update that f64 does not show can hinge
                // on gradient elements that candle's f32 summation leaves
                // exactly 0.0 and PyTorch's does not: not judged.
                _ if finding.phase == Phase::Update && finding.kind == FindingKind::Nan => {
                    FrameworkMark::not_judged(
                        "a NaN in the update that f64 does not show: it may hinge on gradient elements candle's summation leaves exactly 0.0 and PyTorch's does not, which is not emulated",
                    )
                }
                // An op past the dtype's range there is past it in PyTorch's
                // f32 too.
                _ => FrameworkMark::fails_too(
                    "at f32 candle computes as PyTorch does, up to the rules docs/NUMERICS.md lists, and none applies (the step is healthy in f64: the dtype's range is PyTorch's too)",
                ),
            };
        };
        match (run.ran, run.reproduced, run.differs) {
            (false, ..) => FrameworkMark::not_judged(format!("the step with PyTorch's rounding {}", run.note)),
            (true, true, _) if masked => FrameworkMark::fails_too(format!(
                "the row stays fully masked with PyTorch's rounding: {MASKED_ROW}"
            )),
            (true, true, _) => FrameworkMark::fails_too(format!(
                "with PyTorch's rounding (each stage in f32, stored in the half dtype): {}",
                run.note
            )),
            (true, false, true) => FrameworkMark::not_judged(format!(
                "with PyTorch's rounding the step {}",
                run.note
            )),
            // The re-run computes the loss in f32 from logits stored in the
            // half dtype; PyTorch computes a pure-half loss op by op in that
            // dtype (σ(z) is exactly 1.0 in bf16 from z ≈ 6, and 1 − 1e-12
            // is 1.0), which the re-run does not show.
            (true, false, false) if loss_in_half(finding) => FrameworkMark::not_judged(
                "the step is healthy with PyTorch's rounding of each stage, but PyTorch computes this loss op by op in the half dtype, each op rounding its result, and that rounding inside the loss is not emulated",
            ),
            (true, false, false) => FrameworkMark::specific(
                rule_of(finding),
                "the step is healthy with PyTorch's rounding (each stage in f32, stored in the half dtype)",
            ),
        }
    }
}

/// Whether `finding` is a loss-stage failure of a case computed wholly in
/// a half dtype, whose loss PyTorch computes in that dtype too (under
/// mixed precision autocast keeps the loss in f32, as candle does).
fn loss_in_half(finding: &Finding) -> bool {
    finding.phase == Phase::Loss
        && matches!(
            finding.signature.precision,
            PrecisionKind::F16 | PrecisionKind::Bf16
        )
}

/// What PyTorch does with a softmax over a fully masked row, by API: the
/// model's softmax is a plain one, whose counterpart fails too.
const MASKED_ROW: &str = "a softmax over a row masked at every position is NaN in PyTorch's plain softmax (torch.softmax, F.softmax), the counterpart of the model's; only F.scaled_dot_product_attention (PyTorch 2.5 and later) returns zeros for such a row";

/// The mark of a finding that hinges on exactly-zero gradient elements:
/// PyTorch fails too where every zero is structural (it stays 0.0 when
/// the parameters move by 1e-6: a weight behind a dead unit, an embedding
/// row never indexed); a zero that moves came from candle's rounding,
/// where PyTorch's summation order can leave noise instead.
fn exact_zeros(check: &PrecisionCheck) -> FrameworkMark {
    match (check.exact_zero_gradients, check.structural_zero_gradients) {
        (Some(n), Some(s)) if n > 0 && s == n => FrameworkMark::fails_too(format!(
            "its {n} exactly-zero gradient elements are structural: they stay 0.0 when every parameter moves by 1e-6 (a weight behind a dead unit, an embedding row never indexed), so PyTorch's gradient is 0.0 there too"
        )),
        (Some(n), Some(s)) => FrameworkMark::specific(
            CandleRule::ExactZeros,
            &format!(
                "0/0 on gradient elements that are exactly 0.0, {} of {n} from rounding (they move when the parameters move by 1e-6)",
                n - s
            ),
        ),
        _ => FrameworkMark::specific(
            CandleRule::ExactZeros,
            "0/0 on gradient elements that are exactly 0.0",
        ),
    }
}

/// The rule a half-precision finding that PyTorch's rounding does not
/// reproduce hinges on, from what its stage computes.
fn rule_of(finding: &Finding) -> CandleRule {
    let op = finding.op.map(|o| o.kind);
    let pattern = finding.explanation.as_ref().map(|e| e.pattern);
    if finding.phase == Phase::Backward && matches!(op, Some(OpKind::Sqrt | OpKind::Pow)) {
        return CandleRule::SqrtBackward;
    }
    match op {
        Some(OpKind::Norm) => CandleRule::HalfNormStatistics,
        Some(OpKind::Mask) if finding.kind == FindingKind::Nan => CandleRule::HalfAffine,
        Some(k) if k.accumulates() || k == OpKind::Pool || k == OpKind::Loss => {
            CandleRule::HalfAccumulation
        }
        _ if pattern == Some(Pattern::AccumulationOverflow) => CandleRule::HalfAccumulation,
        _ => CandleRule::HalfIntermediate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_zeros_are_candles_only_where_some_came_from_rounding() {
        let check = |exact, structural| PrecisionCheck {
            verdict: Robustness::HangsOnExactZeros,
            reruns: Vec::new(),
            exact_zero_gradients: Some(exact),
            structural_zero_gradients: Some(structural),
            framework: None,
        };
        let all = exact_zeros(&check(5, 5));
        assert_eq!(all.verdict, FrameworkVerdict::FailsToo);
        let some = exact_zeros(&check(5, 3));
        assert_eq!(
            (some.verdict, some.rule),
            (
                FrameworkVerdict::CandleSpecific,
                Some(CandleRule::ExactZeros)
            )
        );
    }
}
