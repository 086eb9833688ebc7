//! A softmax (or a log-softmax) of a row that is entirely −inf is 0/0:
//! NaN in every position of the row. Which positions are −inf is set by a
//! mask, not by values a gradient moves, so the hunt does not search it by
//! the input's values (token models pad a row instead). Explained by what
//! made the row: a fill with −inf (`where_cond`), a mask added, a mask
//! value cast to half precision (−1e9 is −inf in f16).

use super::walk::{counted, values, Cx};
use super::{OpRule, View};
use crate::error::Result;
use crate::finding::{Explanation, OpKind, Pattern};
use candle_core::Tensor;

pub(super) struct Softmax;

impl OpRule for Softmax {
    fn kinds(&self) -> &'static [OpKind] {
        &[OpKind::Softmax]
    }

    fn id(&self) -> &'static str {
        "masked_row"
    }

    fn domain(&self) -> &'static str {
        "softmax over a fully masked row"
    }

    fn not_searched(&self) -> Option<&'static str> {
        Some("which positions a mask covers is not set by the input's values")
    }

    fn by_padding(&self) -> bool {
        true
    }

    fn margin(&self, v: &View) -> Result<Option<f64>> {
        // How many positions are masked is no distance in decades.
        Ok(super::non_finite(v.output)?.then_some(0.0))
    }

    fn pressure(&self, _: &View) -> Result<Option<Tensor>> {
        Ok(None)
    }

    fn forward(&self, cx: &Cx, i: usize) -> Result<Option<Explanation>> {
        masked_rows(cx, i)
    }
}

/// NaN rows of a softmax (or log-softmax) `i` whose input row is all −inf.
pub(super) fn masked_rows(cx: &Cx, i: usize) -> Result<Option<Explanation>> {
    let Some(x) = cx.reads(i).first().copied() else {
        return Ok(None);
    };
    let (xs, out) = (values(x.tensor)?, values(cx.output(i))?);
    let width = *x.tensor.dims().last().unwrap_or(&1);
    if xs.len() != out.len() || width == 0 {
        return Ok(None);
    }
    let rows = xs.len() / width;
    let masked: Vec<usize> = (0..rows)
        .filter(|&r| {
            let (xr, yr) = (
                &xs[r * width..(r + 1) * width],
                &out[r * width..(r + 1) * width],
            );
            xr.iter().all(|&v| v == f64::NEG_INFINITY) && yr.iter().any(|v| v.is_nan())
        })
        .collect();
    let bad_rows = (0..rows)
        .filter(|&r| {
            out[r * width..(r + 1) * width]
                .iter()
                .any(|v| !v.is_finite())
        })
        .count();
    if masked.is_empty() || masked.len() != bad_rows {
        return Ok(None);
    }
    let n = masked.len();
    let subject = cx.subject(i);
    let name = cx.name(&x)?;
    let mut pattern = Pattern::MaskedRow;
    let mut how = String::new();
    let mut repair = "mask with a finite value the dtype holds (−1e9; −1e4 in half precision), or give fully masked rows a defined output".to_string();
    if let Some((j, kind)) = cx.maker_through_views(&x)? {
        match kind {
            OpKind::Select => {
                how = format!(
                    "; {} fills every position of those rows with −inf",
                    cx.name_of(j)
                );
            }
            OpKind::Add | OpKind::Sub => {
                pattern = Pattern::MaskInsideSoftmax;
                let mask = cx
                    .reads(j)
                    .into_iter()
                    .find(|r| values(r.tensor).is_ok_and(|v| v.contains(&f64::NEG_INFINITY)));
                how = format!(
                    "; {} adds a mask{} that leaves those rows no position",
                    cx.name_of(j),
                    match mask {
                        Some(m) => format!(" ({}, −inf where masked)", cx.name(&m)?),
                        None => String::new(),
                    }
                );
            }
            OpKind::Cast => {
                pattern = Pattern::HalfCastOverflow;
                how = format!(
                    "; {} made the −inf: a mask value cast to {} past its range",
                    cx.name_of(j),
                    super::walk::Range::of(cx.output(j).dtype()).name()
                );
                repair = "use a mask value the half precision holds (−1e4, or the dtype's min), not −1e9 cast to it".into();
            }
            _ => {}
        }
    }
    let sentence = format!(
        "{subject} takes a softmax over {} of {name} that are entirely −inf (every position masked): 0/0 = NaN{how}",
        counted(n, "row")
    );
    cx.explained(i, pattern, n, Some(&x), sentence, repair)
        .map(Some)
}
