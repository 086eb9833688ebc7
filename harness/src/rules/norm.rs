//! A normalization a model declares as a stage (`OpKind::Norm`: a layer,
//! RMS or batch norm, x / ‖x‖): a row of its input that is all zeros is
//! 0/0. The stage-level path's rule (an instrumented norm by hand is a
//! division, with its own rule).

use super::walk::{values, Range};
use super::{decades, OpRule, View};
use crate::error::Result;
use crate::finding::OpKind;
use candle_core::{DType, Tensor, D};

pub(super) struct Norm;

impl OpRule for Norm {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Norm]
    }

    fn id(&self) -> &'static str {
        "zero_norm"
    }

    fn domain(&self) -> &'static str {
        "norm of a zero row"
    }

    fn at_zero(&self) -> bool {
        true
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        if super::non_finite(v.output)? {
            return Ok(Some(0.0));
        }
        // Token ids are not what a norm reads: nothing to measure.
        let Some(x) = v.read() else {
            return Ok(None);
        };
        let tiny = Range::of(v.output.dtype()).tiny;
        let rows = values(&x.sqr()?.sum(D::Minus1)?)?;
        let lo = rows.iter().copied().fold(f64::INFINITY, f64::min);
        Ok(Some(decades(lo.max(tiny) / tiny)))
    }

    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        let Some(x) = v.read() else {
            return Ok(None);
        };
        Ok(Some(
            x.to_dtype(DType::F32)?
                .sqr()?
                .sum(D::Minus1)?
                .flatten_all()?
                .min(0)?
                .neg()?,
        ))
    }
}
