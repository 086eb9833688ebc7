//! A finding's explanation as the finding carries it: the numerical
//! pattern at the producing stage, in the user's terms, with its repair
//! ([`crate::explain`] reads it from the traced records).

use serde::{Deserialize, Serialize};

/// The numerical pattern behind a stage's non-finite values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Pattern {
    /// log(0) = -inf: outputs -inf where the input is exactly 0.
    LogOfZero,
    /// log or sqrt of x < 0 = NaN: outputs NaN where the input is negative.
    NegativeDomain,
    /// x / ‖x‖ for a row of zeros: whole rows of NaN whose input is all 0.
    ZeroNormRow,
    /// 0/0 element-wise: NaN where the input is exactly 0.
    ZeroOverZero,
    /// x/0 element-wise: ±inf where the input is exactly 0 (a ratio's log
    /// with it, log(t/p) where p is 0, is +inf).
    DivisionByZero,
    /// softmax over a row that is entirely -inf (every position masked).
    MaskedRow,
    /// exp(x) past the dtype's range: ∞ where the input exceeds ln(max).
    ExpOverflow,
    /// A sum or a product (a matmul) past the dtype's range from inputs
    /// inside it: an overflow of the accumulation.
    AccumulationOverflow,
    /// The backward pass of sqrt or x^p (p < 1) at exactly 0: an infinite slope.
    InfiniteSlopeAtZero,
    /// The backward pass overflowed from finite values.
    BackwardOverflow,
    /// A log of exact zeros times zero inside one stage (target · log(p)
    /// where p and the target are 0): 0·(−inf) = NaN.
    ZeroTimesLogOfZero,
    /// A log of a softmax that underflowed inside the stage: a row of the
    /// logits spans more than the dtype's exp can hold, so some
    /// probabilities are exactly 0 and their log is −inf.
    LogOfUnderflowedSoftmax,
    /// exp of a value the stage scales up inside (exp(k·x)): +inf where the
    /// input itself is well inside ln(max).
    ExpOfScaledInput,
    /// A normalization over a constant row or column: its standard
    /// deviation is exactly 0 and (x − mean)/std is 0/0.
    ConstantNormalized,
    /// A gate (a sigmoid) that rounded to exactly 1 (or 0) where the stage
    /// takes the log of 1 − gate (or of gate): −inf, and NaN times a zero.
    SaturatedGate,
    /// A softmax whose rows turn NaN in full from finite scores: a mask
    /// added inside the stage left those rows no position.
    MaskInsideSoftmax,
    /// A ratio of a tensor to itself shifted by one (x\[i+1\] / x\[i\]) where
    /// it holds consecutive exact zeros (an underflowed cumulative product).
    ShiftedRatio,
    /// The backward pass of a root of a sum of squares (sqrt(a² + b²), a
    /// norm) at exactly 0: 0/0 in every entry of the row.
    RootOfReducedZero,
    /// The log of a sum of exps (a logsumexp) without the max subtracted:
    /// an entry past ln(max) makes the exp, the sum and the log +inf.
    LogOfOverflowedExp,
    /// An exact 0 times an infinity (0·(−inf), 0·exp overflowed): NaN.
    ZeroTimesInfinity,
    /// An infinity minus itself (inf − inf, or −inf + inf): NaN.
    InfMinusInf,
    /// An unbiased variance of one value: (n − 1) = 0 divides 0 by 0.
    VarianceOfOneValue,
    /// A value cast to a half precision past its largest: ±inf (a mask
    /// constant of −1e9 in f16).
    HalfCastOverflow,
    /// Non-finite values from finite inputs, with none of the patterns above.
    Unexplained,
}

impl Pattern {
    /// The pattern's name as reports give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::LogOfZero => "log of exact zeros",
            Pattern::NegativeDomain => "log or square root of negative values",
            Pattern::ZeroNormRow => "norm of an all-zero row",
            Pattern::ZeroOverZero => "0/0",
            Pattern::DivisionByZero => "division by exact zeros",
            Pattern::MaskedRow => "softmax over a fully masked row",
            Pattern::ExpOverflow => "exp past the dtype's range",
            Pattern::AccumulationOverflow => "an accumulation past the dtype's range",
            Pattern::InfiniteSlopeAtZero => "sqrt or pow at 0 in the backward pass",
            Pattern::BackwardOverflow => "an overflow in the backward pass",
            Pattern::ZeroTimesLogOfZero => "0 times the log of 0",
            Pattern::LogOfUnderflowedSoftmax => "log of an underflowed softmax",
            Pattern::ExpOfScaledInput => "exp of a scaled-up input",
            Pattern::ConstantNormalized => "normalization of a constant row or column",
            Pattern::SaturatedGate => "a gate saturated to exactly 1 or 0",
            Pattern::MaskInsideSoftmax => "a mask added inside a softmax",
            Pattern::ShiftedRatio => "a ratio of shifted slices at 0/0",
            Pattern::RootOfReducedZero => "a root of a sum of squares at 0 in the backward pass",
            Pattern::LogOfOverflowedExp => "exp then log: a logsumexp without its max",
            Pattern::ZeroTimesInfinity => "0 times an infinity",
            Pattern::InfMinusInf => "an infinity minus an infinity",
            Pattern::VarianceOfOneValue => "a variance of one value",
            Pattern::HalfCastOverflow => "a cast to half precision past its range",
            Pattern::Unexplained => "non-finite values from finite inputs",
        }
    }
}

/// What the stage did, and what would repair it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// What the stage did.
    pub pattern: Pattern,
    /// The producing stage.
    pub stage: String,
    /// The record before it, read as the stage's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// How many values (or rows, for the row patterns) show the pattern.
    pub count: usize,
    /// The pattern was told by the op kind the stage's name reads as: no
    /// values could tell, and the model did not declare the stage's op.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_name: bool,
    /// One sentence in the user's terms.
    pub sentence: String,
    /// The repair the pattern calls for.
    pub repair: String,
    /// The repair as the stable formulation that fits the stage (its naive
    /// op of what it read reproduces its output): what diagnose
    /// substitutes through the tracer to verify it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formulation: Option<super::Formulation>,
    /// The op the explanation is about, in an instrumented function
    /// (`#[nanhunt::instrument]`): its kind, line and expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<super::OpSite>,
    /// The op that made what that op read, where an instrumented op did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_site: Option<super::OpSite>,
    /// The repair as a rewrite of that op's expression (instrumented
    /// code): what diagnose substitutes at the op and shows as a diff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<super::Rewrite>,
}

impl Explanation {
    /// The repair as code to paste, where a stable formulation fits the stage.
    pub fn repair_code(&self) -> Option<String> {
        self.formulation.as_ref().map(|f| f.code(&self.stage))
    }
}
