//! x^p: NaN below 0 for a fractional p, +inf at 0 for p < 0, and for
//! 0 < p < 1 an infinite slope at 0 in the backward pass (as a root's).

use super::sqrt::{negative, root_margin, slope_at_zero};
use super::walk::Cx;
use super::{OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind};
use candle_core::{DType, Tensor};

pub(super) struct Pow;

impl OpRule for Pow {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Pow]
    }

    fn id(&self) -> &'static str {
        "power_at_zero"
    }

    fn domain(&self) -> &'static str {
        "fractional power at 0"
    }

    fn at_zero(&self) -> bool {
        true
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        // An integer power of 1 or more has no unsafe point at 0.
        if v.scalars
            .first()
            .is_some_and(|p| *p >= 1.0 && p.fract() == 0.0)
        {
            return super::overflow_margin(v.output);
        }
        root_margin(v.output)
    }

    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        Ok(Some(
            v.output
                .to_dtype(DType::F32)?
                .flatten_all()?
                .min(0)?
                .neg()?,
        ))
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        negative(cx, i, "fractional power")
    }

    fn backward(&self, cx: &Cx, i: usize, k: usize, grad: &Tensor) -> Result<Option<Explanation>> {
        slope_at_zero(cx, i, k, grad, "power below 1")
    }
}
