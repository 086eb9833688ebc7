//! a + b, a − b: an infinity minus itself is NaN (+inf − +inf, −inf + +inf),
//! and in half precision a sum of values inside the range can pass it.

use super::product::overflowed;
use super::walk::{counted, values, Cx};
use super::OpRule;
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use candle_core::DType;

pub(super) struct Sum;

impl OpRule for Sum {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Add, OpKind::Sub]
    }

    fn id(&self) -> &'static str {
        "sum"
    }

    fn domain(&self) -> &'static str {
        "sum past the range"
    }

    fn risky(&self, dtype: DType) -> bool {
        super::half(dtype)
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        let args = cx.args(i);
        let out_t = cx.output(i);
        let out = values(out_t)?;
        let mut vals = Vec::new();
        for a in &args {
            match cx.arg_values(a, out_t)? {
                Some(v) => vals.push(v),
                None => return Ok(None),
            }
        }
        let nan = out.iter().filter(|v| v.is_nan()).count();
        let opposed = (0..out.len())
            .filter(|&k| out[k].is_nan() && vals.iter().filter(|v| v[k].is_infinite()).count() == 2)
            .count();
        if opposed > 0 && opposed == nan {
            let mut names = Vec::new();
            for a in &args {
                names.push(cx.arg_name(a)?);
            }
            let mut sentence = format!(
                "{} combines {} with infinities that cancel in {}: inf − inf = NaN",
                cx.subject(i),
                names.join(" and "),
                counted(opposed, "value")
            );
            // x − max(x) over a row that is entirely −inf (a masked row).
            let max_of_row = cx.reads(i).iter().any(|r| {
                cx.maker(r)
                    .ok()
                    .flatten()
                    .is_some_and(|j| cx.kind(j) == Some(OpKind::Extremum))
            });
            if max_of_row && cx.kind(i) == Some(OpKind::Sub) {
                sentence.push_str(
                    ": it subtracts a row's max from rows that are entirely −inf (every position masked), whose max is −inf too",
                );
            }
            let read = cx.reads(i).first().copied();
            return cx
                .explained(
                    i,
                    Pattern::InfMinusInf,
                    opposed,
                    read.as_ref(),
                    sentence,
                    "keep both operands finite where they meet (a finite mask value, a clamp before the op)".into(),
                )
                .map(Some);
        }
        let verb = if cx.kind(i) == Some(OpKind::Sub) {
            "subtracts"
        } else {
            "adds"
        };
        overflowed(cx, i, &vals, verb, "a sum")
    }
}
