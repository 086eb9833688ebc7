//! The repair an explanation's pattern calls for, as the stable
//! formulation that fits the stage: a formulation that recomputes the
//! stage is chosen only where its naive op of the record it reads
//! reproduces the stage's output (the stage is what the pattern says it
//! is); one that moves the input into the op's domain, where the pattern
//! was read from that input's values.

use super::Pattern;
use crate::error::Result;
use crate::finding::{Axis, Formulation, Substitute};
use crate::intervention::substitute::{
    below_one, eps, exp_cap, exp_scale, fits, log_space_floor, mask_fill, norm_eps,
};
use crate::models::Record;
use crate::spec::machine_epsilon;
use candle_core::Tensor;

/// The formulation for `pattern` at a stage that made `out`; `reads` are
/// the records before it, nearest first; `from_values`: the pattern was
/// read from the nearest one's values.
pub(super) fn choose(
    pattern: Pattern,
    from_values: bool,
    reads: &[&Record],
    out: &Tensor,
) -> Result<Option<Formulation>> {
    let Some(x) = reads.first().map(|r| &r.output) else {
        return Ok(None);
    };
    let candidates = candidates(pattern, from_values, x, out)?;
    for (s, at) in candidates {
        // The logits two records back, recomputing the record before.
        let (read, replaced) = match at {
            LOGITS => (reads.get(1), reads.first().copied()),
            i => (reads.get(i), None),
        };
        let Some(read) = read else {
            continue;
        };
        let made = replaced.map_or(out, |r| &r.output);
        // Moving the input needs no fit (the pattern was read from it):
        // `fits` has no naive form to check for it.
        if fits(s, &read.output, made)? {
            return Ok(Some(Formulation {
                reads: read.name.clone(),
                replaces: replaced.map(|r| r.name.clone()),
                substitute: s,
            }));
        }
    }
    Ok(None)
}

/// The substitutes that fit `pattern`, each with which record before the
/// stage it reads (0: the nearest; [`LOGITS`]: the logits two back), in
/// the order they are tried; `x` is what the nearest record made.
fn candidates(
    pattern: Pattern,
    from_values: bool,
    x: &Tensor,
    out: &Tensor,
) -> Result<Vec<(Substitute, usize)>> {
    let dt = out.dtype();
    let e = eps(dt);
    // (the substitute, which of `reads` it reads); see `LOGITS` for the
    // one that recomputes the record before the stage.
    let moved = |s: Substitute| vec![(s, 0)];
    let from_logits = Substitute::LogSpaceSoftmax {
        floor: log_space_floor(dt),
    };
    Ok(match pattern {
        // A log of a softmax's zeros: log_softmax of the logits before it
        // where they fit, else the probabilities recomputed from them in
        // log space, else an eps on them.
        Pattern::LogOfZero if from_values => vec![
            (Substitute::LogSoftmax, 1),
            (from_logits, LOGITS),
            (Substitute::AddEps { eps: e }, 0),
        ],
        Pattern::LogOfZero | Pattern::LogOfUnderflowedSoftmax => vec![(Substitute::LogSoftmax, 0)],
        // A loss's log of (or ratio to) a softmax's zeros: the
        // probabilities from the logits in log space, else clamped.
        Pattern::ZeroTimesLogOfZero => {
            vec![(from_logits, LOGITS), (Substitute::ClampMin { min: e }, 0)]
        }
        Pattern::DivisionByZero if from_values => {
            vec![(from_logits, LOGITS), (Substitute::ClampMin { min: e }, 0)]
        }
        Pattern::NegativeDomain if from_values => moved(Substitute::ClampMin { min: e }),
        // The gate from its logits with the sigmoid's slope, else clamped.
        Pattern::SaturatedGate => vec![
            (
                Substitute::LogSpaceSigmoid {
                    eps: machine_epsilon(dt),
                },
                LOGITS,
            ),
            (
                Substitute::ClampRange {
                    min: e,
                    max: below_one(dt),
                },
                0,
            ),
        ],
        Pattern::MaskedRow if from_values => moved(Substitute::FiniteMask {
            fill: mask_fill(dt),
        }),
        Pattern::MaskInsideSoftmax => vec![(Substitute::SoftmaxOfMaskedRows, 0)],
        Pattern::ZeroNormRow => vec![(Substitute::NormEps { eps: e }, 0)],
        Pattern::LogOfOverflowedExp => vec![(
            Substitute::LogSumExp {
                keepdim: out.rank() == x.rank(),
            },
            0,
        )],
        Pattern::ExpOverflow | Pattern::ExpOfScaledInput => match exp_scale(x, out)? {
            Some(scale) => vec![(
                Substitute::ClampedScaledExp {
                    scale,
                    cap: exp_cap(dt),
                },
                0,
            )],
            None => Vec::new(),
        },
        Pattern::ConstantNormalized => standardized(dt),
        Pattern::ShiftedRatio => factors(x, out, e),
        Pattern::InfiniteSlopeAtZero => [false, true]
            .map(|rectified| (Substitute::SqrtEps { eps: e, rectified }, 0))
            .to_vec(),
        Pattern::RootOfReducedZero => vec![(
            Substitute::RootEps {
                eps: e,
                keepdim: out.rank() == x.rank(),
            },
            0,
        )],
        _ => Vec::new(),
    })
}

/// (x − mean) / sqrt(var + eps) over the batch or the row, biased or not.
fn standardized(dt: candle_core::DType) -> Vec<(Substitute, usize)> {
    [Axis::Batch, Axis::Row]
        .into_iter()
        .flat_map(|axis| {
            [false, true].map(|unbiased| {
                let s = Substitute::Standardize {
                    axis,
                    unbiased,
                    eps: norm_eps(dt),
                };
                (s, 0)
            })
        })
        .collect()
}

/// A ratio of a cumulative product to itself shifted: the factors where
/// they are on record, else an eps.
fn factors(x: &Tensor, out: &Tensor, e: f64) -> Vec<(Substitute, usize)> {
    match super::inside::shifted_dim(x.dims(), out.dims()) {
        Some(dim) => vec![
            (Substitute::FactorOfCumprod { dim }, 1),
            (Substitute::ShiftedRatioEps { dim, eps: e }, 0),
        ],
        None => Vec::new(),
    }
}

/// A candidate that reads the logits two records back and recomputes the
/// record between them and the stage (the probabilities).
const LOGITS: usize = usize::MAX;
