//! A sum of products (a matmul, a reduction, a linear layer, a
//! convolution, a module's forward) whose result passes a half
//! precision's range although every value it read is inside it.

use super::product::overflowed;
use super::walk::{values, Cx};
use super::{overflow_margin, overflow_pressure, OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind};
use candle_core::{DType, Tensor};

pub(super) struct Accumulate;

impl OpRule for Accumulate {
    fn kinds(&self) -> &'static [OpKind] {
        &[
            OpKind::Matmul,
            OpKind::Reduce,
            OpKind::Layer,
            OpKind::Linear,
            OpKind::Conv,
            OpKind::Scores,
        ]
    }

    fn id(&self) -> &'static str {
        "overflow"
    }

    fn domain(&self) -> &'static str {
        "past the range"
    }

    fn risky(&self, dtype: DType) -> bool {
        matches!(dtype, DType::F16 | DType::BF16)
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        overflow_margin(v.output)
    }

    fn pressure(&self, v: &View) -> Result<Option<Tensor>> {
        overflow_pressure(v.output)
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        let mut read = Vec::new();
        for r in cx.reads(i) {
            if r.tensor.dtype().is_float() {
                read.push(values(r.tensor)?);
            }
        }
        overflowed(cx, i, &read, "accumulates", "a sum")
    }
}
