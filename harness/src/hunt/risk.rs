//! What makes a stage risky, and how close it came: each op with an unsafe
//! domain has a margin — how far what the stage computed stayed from that
//! domain, in decades — and a pressure, the scalar that grows as the stage
//! nears it, whose gradient the search follows.
//!
//! | op | unsafe when | margin (decades) |
//! |---|---|---|
//! | log | its input reaches 0 (-inf) or goes below (NaN) | min(log x) over ln(tiny), the smallest positive value |
//! | exp | its output passes the dtype's largest value | log10(max / max(exp x)) |
//! | sqrt, pow | its input reaches 0 (an infinite slope) or goes below | log10(min(y)² / tiny) |
//! | a norm | a row of its input is all zeros (0/0) | log10(min row Σx² / tiny) |
//! | a division; an accumulation in half precision | its output passes the dtype's largest value | log10(max / max|y|) |

use crate::error::Result;
use crate::finding::OpKind;
use crate::spec::{dtype_max, smallest_positive};
use candle_core::{DType, Tensor, D};
use serde::Serialize;

/// The unsafe domain a risky stage can reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Risk {
    /// A log whose input reaches 0.
    LogOfZero,
    /// An exp past the dtype's range.
    ExpOverflow,
    /// A root (or a power below 1) at or below 0.
    RootAtZero,
    /// A norm of an all-zero row.
    ZeroNorm,
    /// A division or (in half precision) an accumulation past the range.
    Overflow,
    /// A softmax over a row whose every entry is masked (0/0): set by
    /// which positions are masked, not by values a gradient can move.
    MaskedRow,
}

impl Risk {
    /// The risk of a stage computing `op` in `dtype`, if it has one.
    pub fn of(op: OpKind, dtype: DType) -> Option<Risk> {
        if !dtype.is_float() {
            return None;
        }
        let half = matches!(dtype, DType::F16 | DType::BF16);
        Some(match op {
            OpKind::Log | OpKind::LogSoftmax => Risk::LogOfZero,
            OpKind::Exp => Risk::ExpOverflow,
            OpKind::Sqrt | OpKind::Pow => Risk::RootAtZero,
            OpKind::Norm => Risk::ZeroNorm,
            OpKind::Div => Risk::Overflow,
            OpKind::Softmax => Risk::MaskedRow,
            k if half && k.accumulates() => Risk::Overflow,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Risk::LogOfZero => "log of 0",
            Risk::ExpOverflow => "exp past the range",
            Risk::RootAtZero => "root at 0",
            Risk::ZeroNorm => "norm of a zero row",
            Risk::Overflow => "past the range",
            Risk::MaskedRow => "softmax over a fully masked row",
        }
    }

    /// Whether the unsafe point is a 0 that a row of zeros in the input can
    /// reach (the search also tries the smallest row set to 0).
    pub fn at_zero(self) -> bool {
        matches!(self, Risk::LogOfZero | Risk::RootAtZero | Risk::ZeroNorm)
    }

    /// How far the stage stayed from its unsafe domain, in decades: 0 when
    /// it reached it (a non-finite value). `input` is what a norm read.
    pub fn margin(self, output: &Tensor, input: Option<&Tensor>) -> Result<Option<f64>> {
        let dtype = output.dtype();
        let values = flat(output)?;
        if values.iter().any(|v| !v.is_finite()) {
            return Ok(Some(0.0));
        }
        if self == Risk::MaskedRow {
            // How many positions are masked is not a distance in decades.
            return Ok(None);
        }
        let (max, tiny) = (dtype_max(dtype), smallest_positive(dtype));
        let decades = |ratio: f64| ratio.log10().max(0.0);
        Ok(match self {
            Risk::LogOfZero => {
                let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
                Some(((lo - tiny.ln()) / std::f64::consts::LN_10).max(0.0))
            }
            Risk::ExpOverflow => {
                let hi = values.iter().copied().fold(tiny, f64::max);
                Some(decades(max / hi))
            }
            Risk::RootAtZero => {
                let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
                Some(decades((lo * lo).max(tiny) / tiny))
            }
            Risk::ZeroNorm => match input.filter(|x| x.dtype().is_float()) {
                // (Token ids are not what a norm reads: nothing to measure.)
                Some(x) => {
                    let rows = flat(&x.sqr()?.sum(D::Minus1)?)?;
                    let lo = rows.iter().copied().fold(f64::INFINITY, f64::min);
                    Some(decades(lo.max(tiny) / tiny))
                }
                None => None,
            },
            Risk::Overflow => {
                let hi = values.iter().fold(tiny, |m, v| m.max(v.abs()));
                Some(decades(max / hi))
            }
            Risk::MaskedRow => None,
        })
    }

    /// The scalar that grows as the stage nears its unsafe domain (in f32,
    /// differentiable), or `None` when it cannot be read (a norm without
    /// its input).
    pub fn pressure(self, output: &Tensor, input: Option<&Tensor>) -> Result<Option<Tensor>> {
        let y = output.to_dtype(DType::F32)?.flatten_all()?;
        Ok(Some(match self {
            Risk::LogOfZero | Risk::RootAtZero => y.min(0)?.neg()?,
            Risk::ExpOverflow => y.max(0)?,
            Risk::Overflow => y.abs()?.max(0)?,
            Risk::ZeroNorm => match input.filter(|x| x.dtype().is_float()) {
                Some(x) => x
                    .to_dtype(DType::F32)?
                    .sqr()?
                    .sum(D::Minus1)?
                    .flatten_all()?
                    .min(0)?
                    .neg()?,
                None => return Ok(None),
            },
            Risk::MaskedRow => return Ok(None),
        }))
    }
}

fn flat(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(values: &[f32]) -> Tensor {
        Tensor::from_slice(values, (1, values.len()), &Device::Cpu).unwrap()
    }

    #[test]
    fn margins_count_the_decades_left_to_the_unsafe_domain() {
        // log(1e-20) is 20 decades... from 0, and 25 from f32's tiny 1.4e-45.
        let m = Risk::LogOfZero
            .margin(&t(&[(1e-20f32).ln(), 0.0]), None)
            .unwrap()
            .unwrap();
        assert!((m - 24.85).abs() < 0.01, "{m}");
        let m = Risk::ExpOverflow
            .margin(&t(&[3.4e37, 1.0]), None)
            .unwrap()
            .unwrap();
        assert!((m - 1.0).abs() < 0.01, "{m}");
        assert_eq!(
            Risk::RootAtZero.margin(&t(&[0.0, 1.0]), None).unwrap(),
            Some(0.0)
        );
        assert_eq!(
            Risk::Overflow.margin(&t(&[f32::INFINITY]), None).unwrap(),
            Some(0.0)
        );
        let rows = Tensor::new(&[[0f32, 0.0], [1.0, 1.0]], &Device::Cpu).unwrap();
        assert_eq!(
            Risk::ZeroNorm.margin(&rows, Some(&rows)).unwrap(),
            Some(0.0)
        );
    }

    #[test]
    fn only_ops_with_an_unsafe_domain_are_risky() {
        assert_eq!(Risk::of(OpKind::Log, DType::F32), Some(Risk::LogOfZero));
        assert_eq!(Risk::of(OpKind::Linear, DType::F32), None);
        assert_eq!(Risk::of(OpKind::Linear, DType::F16), Some(Risk::Overflow));
        assert_eq!(Risk::of(OpKind::Activation, DType::F16), None);
        assert_eq!(Risk::of(OpKind::Log, DType::U32), None);
    }

    #[test]
    fn a_norm_that_read_token_ids_has_no_margin_to_read() {
        let ids = Tensor::new(&[[0u32, 3], [1, 2]], &Device::Cpu).unwrap();
        let out = Tensor::new(&[[0.5f32, 0.5], [1.0, 1.0]], &Device::Cpu).unwrap();
        assert_eq!(Risk::ZeroNorm.margin(&out, Some(&ids)).unwrap(), None);
        assert!(Risk::ZeroNorm.pressure(&out, Some(&ids)).unwrap().is_none());
    }
}
