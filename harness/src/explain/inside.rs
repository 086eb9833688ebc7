//! Compositions inside one stage, told from what the stage read (the
//! record before it), what it made, and its op's kind: the patterns where
//! the bad value is computed inside the stage, so no element of its input
//! is itself out of the op's domain. Each comes with the numbers that
//! account for it, read from the tensors it quotes.

use super::Pattern;
use crate::finding::OpKind;

/// A composition found, with the phrase of true numbers its sentence quotes.
pub(super) struct Inside {
    pub pattern: Pattern,
    pub count: usize,
    pub quote: String,
}

/// What the stage read and made: values, and the read tensor's dims.
pub(super) struct Seen<'a> {
    pub x: &'a [f64],
    pub x_dims: &'a [usize],
    pub out: &'a [f64],
    pub out_dims: &'a [usize],
    /// The dtype's largest value, and its smallest positive one.
    pub limit: f64,
    pub tiny: f64,
}

/// A composition's detector: the pattern it finds in what a stage read and made.
type Detector = fn(&Seen) -> Option<Inside>;

/// Which compositions a stage that declares a kind can hold, tried in
/// order: a log (or a loss, which takes one) of a product, of an
/// overflowed exp or of an underflowed softmax; an exp of a scaled input;
/// a norm of a constant row or column; a mask added inside a softmax.
const COMPOSITIONS: &[(&[OpKind], &[Detector])] = &[
    (
        &[OpKind::Log, OpKind::Loss],
        &[zero_times_log_of_zero, overflowed_exp, underflowed_softmax],
    ),
    (&[OpKind::Exp], &[scaled_exp]),
    (&[OpKind::Norm], &[constant_normalized]),
    (&[OpKind::Softmax], &[mask_inside_softmax]),
];

/// The composition of an op of `kind` that accounts for the stage's
/// non-finite outputs, if one does.
pub(super) fn find(kind: OpKind, s: &Seen) -> Option<Inside> {
    if s.x.is_empty() || !s.x.iter().all(|v| v.is_finite()) {
        return None;
    }
    let (_, detectors) = COMPOSITIONS
        .iter()
        .find(|(kinds, _)| kinds.contains(&kind))?;
    detectors.iter().find_map(|d| d(s))
}

/// Rows of a softmax that are NaN in full where its input is finite: a
/// mask added inside the stage masked every position of them.
fn mask_inside_softmax(s: &Seen) -> Option<Inside> {
    let width = *s.x_dims.last()?;
    if s.x_dims != s.out_dims || width == 0 {
        return None;
    }
    let rows: Vec<&[f64]> = s.out.chunks(width).collect();
    let nan_rows = rows.iter().filter(|r| r.iter().all(|v| v.is_nan())).count();
    let partly = rows
        .iter()
        .any(|r| r.iter().any(|v| !v.is_finite()) && !r.iter().all(|v| v.is_nan()));
    (nan_rows > 0 && !partly).then(|| Inside {
        pattern: Pattern::MaskInsideSoftmax,
        count: nan_rows,
        quote: format!(
            "{nan_rows} of its {} rows are NaN in every position",
            rows.len()
        ),
    })
}

/// The width of the last dimension of `x` when `out` is `x` reduced over
/// it (with or without that dimension kept as 1), and it is not empty.
pub(super) fn reduced_last(x_dims: &[usize], out_dims: &[usize]) -> Option<usize> {
    let (&width, lead) = x_dims.split_last()?;
    let reduced = out_dims == lead || out_dims.split_last() == Some((&1, lead));
    (reduced && width > 0).then_some(width)
}

/// The dimension along which `out` is `x` one shorter: a ratio (or a
/// difference) of `x` to itself shifted by one.
pub(super) fn shifted_dim(x_dims: &[usize], out_dims: &[usize]) -> Option<usize> {
    if x_dims.len() != out_dims.len() {
        return None;
    }
    let differ: Vec<usize> = (0..x_dims.len())
        .filter(|&d| x_dims[d] != out_dims[d])
        .collect();
    match differ[..] {
        [d] if out_dims[d] + 1 == x_dims[d] => Some(d),
        _ => None,
    }
}

/// x[i+1] / x[i] along a dimension where `x` holds exact zeros: every
/// non-finite output divides by one of them (0/0 where both are 0).
pub(super) fn shifted_ratio(s: &Seen) -> Option<Inside> {
    let d = shifted_dim(s.x_dims, s.out_dims)?;
    let n = s.x_dims[d];
    let inner: usize = s.x_dims[d + 1..].iter().product();
    let mut bad = 0;
    for (j, y) in s.out.iter().enumerate() {
        if y.is_finite() {
            continue;
        }
        let (outer, rest) = (j / ((n - 1) * inner), j % ((n - 1) * inner));
        let (i, k) = (rest / inner, rest % inner);
        let at = |i: usize| s.x[outer * n * inner + i * inner + k];
        if at(i) != 0.0 || (y.is_nan() && at(i + 1) != 0.0) {
            return None;
        }
        bad += 1;
    }
    let zeros = s.x.iter().filter(|&&v| v == 0.0).count();
    (bad > 0).then(|| Inside {
        pattern: Pattern::ShiftedRatio,
        count: bad,
        quote: format!(
            "{zeros} of its {} values are exactly 0 (an underflowed cumulative product, say), so {bad} of the ratios x[i+1] / x[i] along dimension {d} divide by 0",
            s.x.len()
        ),
    })
}

fn nan_without_inf(out: &[f64]) -> bool {
    out.iter().any(|v| v.is_nan()) && !out.iter().any(|v| v.is_infinite())
}

/// NaN (and no ±inf) from probabilities with exact zeros: the log of the
/// zeros is −inf, and a zero factor (the target) makes 0·(−inf) = NaN.
fn zero_times_log_of_zero(s: &Seen) -> Option<Inside> {
    if !nan_without_inf(s.out) || s.x.iter().any(|&v| v < 0.0) {
        return None;
    }
    let zeros = s.x.iter().filter(|&&v| v == 0.0).count();
    let positive_min =
        s.x.iter()
            .copied()
            .filter(|&v| v > 0.0)
            .fold(f64::INFINITY, f64::min);
    (zeros > 0).then(|| Inside {
        pattern: Pattern::ZeroTimesLogOfZero,
        count: zeros,
        quote: format!(
            "{zeros} of {} values exactly 0 (the others at least {positive_min:.3e})",
            s.x.len()
        ),
    })
}

/// A log of a sum of exps over the last dimension (the stage reduces it:
/// one output per row) that is +inf on rows with an entry past ln(max):
/// the exp overflows before the sum and the log.
fn overflowed_exp(s: &Seen) -> Option<Inside> {
    let width = reduced_last(s.x_dims, s.out_dims)?;
    if s.out.iter().any(|v| v.is_nan()) {
        return None;
    }
    let ln_max = s.limit.ln();
    let peaks: Vec<f64> =
        s.x.chunks(width)
            .map(|r| r.iter().copied().fold(f64::NEG_INFINITY, f64::max))
            .collect();
    let bad = s.out.iter().filter(|&&v| v == f64::INFINITY).count();
    let rows = s
        .out
        .iter()
        .zip(&peaks)
        .filter(|&(&y, &p)| y == f64::INFINITY && p > ln_max)
        .count();
    let top = peaks.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (rows > 0 && rows == bad).then(|| Inside {
        pattern: Pattern::LogOfOverflowedExp,
        count: rows,
        quote: format!(
            "{rows} of its {} rows have an entry above {ln_max:.1} (up to {top:.4e})",
            peaks.len()
        ),
    })
}

/// A row of logits whose spread (max − min) passes −ln(the dtype's
/// smallest positive value): exp underflows to exactly 0 at its minimum,
/// so a softmax computed from it holds zeros and their log is −inf.
fn underflowed_softmax(s: &Seen) -> Option<Inside> {
    let width = *s.x_dims.last()?;
    if width < 2 || !s.out.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let reach = -s.tiny.ln();
    let spreads: Vec<f64> =
        s.x.chunks(width)
            .map(|row| {
                let (lo, hi) = row
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                        (lo.min(v), hi.max(v))
                    });
                hi - lo
            })
            .collect();
    let rows = spreads.iter().filter(|&&d| d > reach).count();
    let widest = spreads.iter().copied().fold(0.0, f64::max);
    (rows > 0).then(|| Inside {
        pattern: Pattern::LogOfUnderflowedSoftmax,
        count: rows,
        quote: format!(
            "{rows} of {} rows span more than {reach:.1} from their largest to their smallest logit (up to {widest:.4e})",
            spreads.len()
        ),
    })
}

/// +inf where the input is inside ln(max): the stage scales it up before
/// the exp; the least factor that overflows there is ln(max) / the largest
/// such input.
fn scaled_exp(s: &Seen) -> Option<Inside> {
    if s.x_dims != s.out_dims || s.out.iter().any(|v| v.is_nan()) {
        return None;
    }
    let at: Vec<f64> =
        s.x.iter()
            .zip(s.out)
            .filter(|&(_, &y)| y == f64::INFINITY)
            .map(|(&a, _)| a)
            .collect();
    let peak = at.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let ln_max = s.limit.ln();
    (!at.is_empty() && peak > 0.0 && peak <= ln_max).then(|| Inside {
        pattern: Pattern::ExpOfScaledInput,
        count: at.len(),
        quote: format!(
            "the input there is at most {peak:.4}, so the stage multiplies it by at least {:.1} before the exp (exp overflows past {ln_max:.1})",
            ln_max / peak
        ),
    })
}

/// The rows (or the columns across the batch) of the input that are
/// constant while every output of theirs is non-finite.
fn constant_normalized(s: &Seen) -> Option<Inside> {
    let width = *s.x_dims.last()?;
    if s.x_dims != s.out_dims || width == 0 {
        return None;
    }
    let rows = s.x.len() / width;
    let bad = |i: usize| !s.out[i].is_finite();
    let constant_rows: Vec<usize> = (0..rows)
        .filter(|&r| {
            let row = &s.x[r * width..(r + 1) * width];
            width > 1 && row.iter().all(|&v| v == row[0]) && (0..width).all(|j| bad(r * width + j))
        })
        .collect();
    if let Some(&r) = constant_rows.first() {
        return Some(Inside {
            pattern: Pattern::ConstantNormalized,
            count: constant_rows.len(),
            quote: format!(
                "{} constant rows (row {r} holds {} in all {width} positions)",
                constant_rows.len(),
                s.x[r * width]
            ),
        });
    }
    let constant_cols: Vec<usize> = (0..width)
        .filter(|&j| {
            rows > 1
                && (0..rows).all(|r| s.x[r * width + j] == s.x[j])
                && (0..rows).all(|r| bad(r * width + j))
        })
        .collect();
    let &j = constant_cols.first()?;
    Some(Inside {
        pattern: Pattern::ConstantNormalized,
        count: constant_cols.len(),
        quote: format!(
            "{} columns constant across the batch (column {j} holds {} in all {rows} rows)",
            constant_cols.len(),
            s.x[j]
        ),
    })
}
