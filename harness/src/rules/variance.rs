//! An unbiased variance (candle's `var`, `var_keepdim`) divides by n − 1:
//! over one value it is 0/0. How many values it reads is set by a shape
//! (a batch of one row), not by values a gradient moves.

use super::walk::{values, Cx};
use super::{OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use candle_core::Tensor;

pub(super) struct Variance;

impl OpRule for Variance {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Variance]
    }

    fn id(&self) -> &'static str {
        "variance_of_one"
    }

    fn domain(&self) -> &'static str {
        "variance of one value"
    }

    fn not_searched(&self) -> Option<&'static str> {
        Some("how many values a variance reads is set by a shape (a batch of one row), not by the input's values")
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        Ok(super::non_finite(v.output)?.then_some(0.0))
    }

    fn pressure(&self, _: &View) -> Result<Option<Tensor>> {
        Ok(None)
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        let Some(x) = cx.reads(i).first().copied() else {
            return Ok(None);
        };
        let (dims, out_dims) = (x.tensor.dims(), cx.output(i).dims());
        let out = values(cx.output(i))?;
        let nan = out.iter().filter(|v| v.is_nan()).count();
        // A reduced dimension of size 1: kept as 1, or gone.
        let one = dims.iter().enumerate().find(|&(d, &n)| {
            n == 1 && (out_dims.len() < dims.len() || out_dims.get(d) == Some(&1))
        });
        let (Some((d, _)), true) = (one, nan == out.len() && nan > 0) else {
            return Ok(None);
        };
        let sentence = format!(
            "{} takes the variance of {} over dimension {d}, which holds 1 value: the unbiased variance divides by n − 1 = 0, and 0/0 = NaN",
            cx.subject(i),
            cx.name(&x)?
        );
        cx.explained(
            i,
            Pattern::VarianceOfOneValue,
            nan,
            Some(&x),
            sentence,
            "divide by n (the biased variance, `(x − mean)².mean_keepdim(d)`), or keep batches of one row out (drop_last)".into(),
        )
        .map(Some)
    }
}
