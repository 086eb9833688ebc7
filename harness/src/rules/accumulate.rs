//! A sum of products (a matmul, a reduction, a linear layer, a
//! convolution, a module's forward) whose result passes a half
//! precision's range although every value it read is inside it.

use super::product::overflowed;
use super::walk::{values, Cx};
use super::OpRule;
use crate::error::Result;
use crate::finding::{Explanation, OpKind};
use candle_core::DType;

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
        super::half(dtype)
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
