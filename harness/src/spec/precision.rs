//! Floating-point precision, including mixed precision with loss scaling.

use candle_core::DType;
use serde::{Deserialize, Serialize};

/// A half-precision dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HalfType {
    /// IEEE half precision (5 exponent bits, largest value 65504).
    F16,
    /// bfloat16 (8 exponent bits, f32's range, 8 bits of mantissa).
    Bf16,
}

impl HalfType {
    /// The candle dtype.
    pub fn dtype(self) -> DType {
        match self {
            HalfType::F16 => DType::F16,
            HalfType::Bf16 => DType::BF16,
        }
    }

    /// The half type of `dtype`, if it is one.
    pub fn of_dtype(dtype: DType) -> Option<HalfType> {
        match dtype {
            DType::F16 => Some(HalfType::F16),
            DType::BF16 => Some(HalfType::Bf16),
            _ => None,
        }
    }

    /// The name of a re-run computed in f32 with every stage stored in
    /// this dtype (PyTorch's half-precision rounding).
    pub fn stored_in_f32_name(self) -> String {
        format!("f32 stored as {}", self.dtype().as_str())
    }
}

/// The precision a case trains in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Precision {
    /// Single precision throughout.
    #[default]
    F32,
    /// Double precision throughout.
    F64,
    /// f16 weights, activations, gradients and optimizer state.
    F16,
    /// bf16 weights, activations, gradients and optimizer state.
    Bf16,
    /// f32 master weights and optimizer state, half-precision forward/backward.
    Mixed {
        /// The half dtype of the forward and backward passes.
        compute: HalfType,
        /// How the loss is scaled before the backward pass.
        #[serde(default)]
        loss_scaling: LossScaling,
    },
}

/// How mixed precision scales the loss.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LossScaling {
    /// No scaling (scale 1): f16 gradients may underflow or overflow.
    None,
    /// A fixed scale; an overflow is a finding.
    Static {
        /// The factor the loss is multiplied by.
        scale: f64,
    },
    /// PyTorch's GradScaler: skip the step and halve the scale on overflow,
    /// double it after `growth_interval` clean steps. A scale below `floor`
    /// means overflow is not transient: that is a finding.
    Dynamic {
        /// The first scale.
        #[serde(default = "init_scale")]
        init: f64,
        /// Clean steps before the scale doubles.
        #[serde(default = "growth_interval")]
        growth_interval: usize,
        /// The smallest scale before overflow is a finding.
        #[serde(default = "one")]
        floor: f64,
    },
}

fn init_scale() -> f64 {
    65536.0
}
fn growth_interval() -> usize {
    2000
}
fn one() -> f64 {
    1.0
}

impl Default for LossScaling {
    fn default() -> Self {
        LossScaling::Dynamic {
            init: init_scale(),
            growth_interval: growth_interval(),
            floor: one(),
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    /// The names of [`Precision::name`]; mixed precision gets dynamic loss scaling.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mixed = |compute| Precision::Mixed {
            compute,
            loss_scaling: LossScaling::default(),
        };
        Ok(match s {
            "f32" => Precision::F32,
            "f64" => Precision::F64,
            "f16" => Precision::F16,
            "bf16" => Precision::Bf16,
            "mixed" | "mixed_f16" => mixed(HalfType::F16),
            "mixed_bf16" => mixed(HalfType::Bf16),
            _ => {
                return Err(format!(
                    "unknown precision `{s}`: expected f32, f64, f16, bf16, mixed_f16 or mixed_bf16"
                ))
            }
        })
    }
}

/// Which precision a run used, without its loss-scaling settings: what a
/// signature records (serialized by name: `"f32"`, `"mixed_f16"`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrecisionKind {
    /// f32.
    F32,
    /// f64.
    F64,
    /// f16.
    F16,
    /// bf16.
    Bf16,
    /// Mixed precision computing in f16.
    MixedF16,
    /// Mixed precision computing in bf16.
    MixedBf16,
}

impl PrecisionKind {
    /// The kind's name (`f32`, `mixed_f16`, …).
    pub fn name(self) -> &'static str {
        match self {
            PrecisionKind::F32 => "f32",
            PrecisionKind::F64 => "f64",
            PrecisionKind::F16 => "f16",
            PrecisionKind::Bf16 => "bf16",
            PrecisionKind::MixedF16 => "mixed_f16",
            PrecisionKind::MixedBf16 => "mixed_bf16",
        }
    }

    /// The precision of a loop whose parameters are `dtype` (a user's
    /// own loop, which has no master copy).
    pub fn of_dtype(dtype: DType) -> PrecisionKind {
        match dtype {
            DType::F64 => PrecisionKind::F64,
            DType::F16 => PrecisionKind::F16,
            DType::BF16 => PrecisionKind::Bf16,
            _ => PrecisionKind::F32,
        }
    }

    /// Whether forward and backward run in a half-precision format (an
    /// infinity there is an overflow of the format).
    pub fn is_half(self) -> bool {
        !matches!(self, PrecisionKind::F32 | PrecisionKind::F64)
    }
}

impl std::fmt::Display for PrecisionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Ordered by name, as signatures were when precision was a string (so
/// reports list them in the same order).
impl Ord for PrecisionKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name().cmp(other.name())
    }
}

impl PartialOrd for PrecisionKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A precision equals its name (`assert_eq!(sig.precision, "f16")`).
impl PartialEq<&str> for PrecisionKind {
    fn eq(&self, name: &&str) -> bool {
        self.name() == *name
    }
}

impl Precision {
    /// The precision's kind.
    pub fn kind(&self) -> PrecisionKind {
        match self {
            Precision::F32 => PrecisionKind::F32,
            Precision::F64 => PrecisionKind::F64,
            Precision::F16 => PrecisionKind::F16,
            Precision::Bf16 => PrecisionKind::Bf16,
            Precision::Mixed {
                compute: HalfType::F16,
                ..
            } => PrecisionKind::MixedF16,
            Precision::Mixed {
                compute: HalfType::Bf16,
                ..
            } => PrecisionKind::MixedBf16,
        }
    }

    /// The precision's name (`f32`, `mixed_f16`, …).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The dtype of parameters and optimizer state.
    pub fn master_dtype(&self) -> DType {
        match self {
            Precision::F32 | Precision::Mixed { .. } => DType::F32,
            Precision::F64 => DType::F64,
            Precision::F16 => DType::F16,
            Precision::Bf16 => DType::BF16,
        }
    }

    /// The dtype of forward and backward computation.
    pub fn compute_dtype(&self) -> DType {
        match self {
            Precision::Mixed { compute, .. } => compute.dtype(),
            other => other.master_dtype(),
        }
    }

    /// The dtype losses are computed in: autocast keeps losses in f32.
    pub fn loss_dtype(&self) -> DType {
        match self {
            Precision::Mixed { .. } => DType::F32,
            other => other.master_dtype(),
        }
    }

    /// The loss scaling, in mixed precision.
    pub fn loss_scaling(&self) -> Option<&LossScaling> {
        match self {
            Precision::Mixed { loss_scaling, .. } => Some(loss_scaling),
            _ => None,
        }
    }
}

/// The smallest positive value of a floating dtype (a subnormal): exp
/// underflows to exactly 0 below its log.
pub fn smallest_positive(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => half::f16::from_bits(1).to_f64(),
        DType::BF16 => half::bf16::from_bits(1).to_f64(),
        DType::F32 => f32::from_bits(1) as f64,
        _ => f64::from_bits(1),
    }
}

/// The machine epsilon of a floating dtype: the gap between 1 and the
/// next larger value (a sigmoid rounds to exactly 1 within half of it).
pub fn machine_epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => half::f16::EPSILON.to_f64(),
        DType::BF16 => half::bf16::EPSILON.to_f64(),
        DType::F32 => f32::EPSILON as f64,
        _ => f64::EPSILON,
    }
}

/// Largest finite value of a floating dtype.
pub fn dtype_max(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.389_531_389_251_535e38,
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    }
}
