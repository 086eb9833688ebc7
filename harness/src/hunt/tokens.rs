//! The trigger search over token ids, where there is no input to follow a
//! gradient along: the gradient of a stage's pressure with respect to the
//! embedding's output, read against the embedding table, gives for every
//! position the first-order gain of swapping its token for each other one
//! (as HotFlip does). Each round swaps, in every row, the token of the
//! largest gain; a candidate that reaches the domain is confirmed by the
//! step engine. The bound is the number of swaps per row.

use super::search::{Found, Pass, Search, Target};
use crate::data::{HostBatch, HostInput};
use crate::error::Result;
use crate::finding::OpKind;
use crate::models::Record;
use candle_core::{DType, Device, Tensor, D};

/// The padding id a fully masked row is made of (BERT's, and the
/// built-in encoder's).
const PADDING: u32 = 0;

/// What a token search came to.
pub(super) enum TokenSearch {
    Found(Box<Found>),
    NotFound,
    /// No recorded stage holds rows of a trainable table at the ids.
    NoEmbedding,
}

/// The embedding a token search reads: the recorded stage that holds the
/// embedded tokens and the table its rows come from.
struct Embedding {
    stage: String,
    /// (vocab, width), in f32.
    table: Tensor,
}

impl Search<'_> {
    /// The first token batch within `swaps` swaps per row of the ground's
    /// batch whose step the engine confirms fails.
    pub fn tokens(&mut self, target: &Target, swaps: usize) -> Result<TokenSearch> {
        let HostInput::Tokens { ids: ids0, dims } = &self.ground.batch.input else {
            return Ok(TokenSearch::NotFound);
        };
        if target.rule.by_padding() {
            return self.padded_row(ids0, dims, swaps);
        }
        let mut ids = ids0.clone();
        // Swaps stay inside the case's vocabulary (a table may be larger).
        let vocab = match self.ground.case.model.input() {
            crate::spec::InputSpec::Tokens { vocab, .. } => vocab,
            _ => usize::MAX,
        };
        let mut embedding = None;
        for round in 0..=swaps {
            if self.out_of_time() {
                return Ok(TokenSearch::NotFound);
            }
            let input = Tensor::from_slice(&ids, dims.as_slice(), &Device::Cpu)?;
            let pass = self.pass(target, &input)?;
            if pass.reached {
                if let Some(found) = self.confirm_tokens(&ids)? {
                    return Ok(TokenSearch::Found(Box::new(found)));
                }
            }
            if round == swaps {
                break;
            }
            if embedding.is_none() {
                embedding = find_embedding(&pass.records, &ids, self.session.vars().1)?;
            }
            let Some(e) = &embedding else {
                return Ok(TokenSearch::NoEmbedding);
            };
            let Some(gain) = gains(&pass, e, &ids)? else {
                break;
            };
            if !swap_best(&mut ids, dims[0].max(1), vocab, &gain) {
                break;
            }
        }
        Ok(TokenSearch::NotFound)
    }

    /// A fully masked row is one of padding only: the row with the most
    /// of token 0 (the usual padding id) made all 0, when that is within
    /// `swaps` swaps. No gradient leads there (a mask is set by ids).
    fn padded_row(&mut self, ids: &[u32], dims: &[usize], swaps: usize) -> Result<TokenSearch> {
        let per = ids.len() / dims[0].max(1);
        let Some((row, zeros)) = ids
            .chunks(per.max(1))
            .map(|r| r.iter().filter(|&&t| t == PADDING).count())
            .enumerate()
            .max_by_key(|&(i, z)| (z, std::cmp::Reverse(i)))
        else {
            return Ok(TokenSearch::NotFound);
        };
        if per - zeros > swaps || zeros == per {
            return Ok(TokenSearch::NotFound);
        }
        let mut padded = ids.to_vec();
        padded[row * per..(row + 1) * per].fill(PADDING);
        Ok(match self.confirm_tokens(&padded)? {
            Some(found) => TokenSearch::Found(Box::new(found)),
            None => TokenSearch::NotFound,
        })
    }

    /// The step engine's verdict on the token batch `ids`.
    fn confirm_tokens(&mut self, ids: &[u32]) -> Result<Option<Found>> {
        let mut batch: HostBatch = self.ground.batch.clone();
        batch.input = HostInput::Tokens {
            ids: ids.to_vec(),
            dims: self.ground.batch.input.dims().to_vec(),
        };
        match self.ground.fire(&batch, None)? {
            Some(f) if f.kind.is_non_finite() => Ok(Some(Found::whole(batch, 0.0, f))),
            _ => Ok(None),
        }
    }
}

/// The recorded embedding stage (declared, or the first record shaped as
/// the tokens with a width) and the trainable table whose rows at the ids
/// are closest to it (a position embedding added in the same stage does
/// not change which table the tokens index).
fn find_embedding(
    records: &[Record],
    ids: &[u32],
    vars: &[candle_core::Var],
) -> Result<Option<Embedding>> {
    let is_embedding = |r: &Record| {
        r.stage_op()
            .is_some_and(|op| matches!(op.kind, OpKind::Embedding | OpKind::Layer))
    };
    let shaped =
        |r: &Record| r.output.elem_count().is_multiple_of(ids.len()) && r.output.rank() >= 2;
    let Some(record) = records
        .iter()
        .find(|r| is_embedding(r) && shaped(r))
        .or_else(|| records.first().filter(|r| shaped(r)))
    else {
        return Ok(None);
    };
    let width = record.output.dim(D::Minus1)?;
    if record.output.elem_count() != ids.len() * width {
        return Ok(None);
    }
    let out = record
        .output
        .to_dtype(DType::F32)?
        .reshape((ids.len(), width))?;
    let largest = ids.iter().copied().max().unwrap_or(0) as usize;
    let index = Tensor::from_slice(ids, ids.len(), out.device())?;
    let mut best: Option<(f64, Tensor)> = None;
    for v in vars {
        let t = v.as_tensor();
        if t.rank() != 2 || t.dim(1)? != width || t.dim(0)? <= largest || !t.dtype().is_float() {
            continue;
        }
        let table = t.to_dtype(DType::F32)?;
        let gathered = table.index_select(&index, 0)?;
        let distance = (gathered - &out)?.abs()?.max_all()?.to_scalar::<f32>()?;
        if best.as_ref().is_none_or(|(d, _)| f64::from(distance) < *d) {
            best = Some((f64::from(distance), table));
        }
    }
    Ok(best.map(|(_, table)| Embedding {
        stage: record.name.clone(),
        table,
    }))
}

/// For every position and token, the first-order gain in the pressure of
/// swapping the position's token for that one: (positions, vocab).
fn gains(pass: &Pass, e: &Embedding, ids: &[u32]) -> Result<Option<Vec<Vec<f32>>>> {
    let (Some(grads), Some(record)) =
        (&pass.grads, pass.records.iter().find(|r| r.name == e.stage))
    else {
        return Ok(None);
    };
    let Some(g) = grads.get(record.grad_probe.as_tensor()) else {
        return Ok(None);
    };
    let width = e.table.dim(1)?;
    let g = g.to_dtype(DType::F32)?.reshape((ids.len(), width))?;
    // g · E[v] for every v; the gain of a swap is its difference from the
    // current token's.
    let scores: Vec<Vec<f32>> = g.matmul(&e.table.t()?)?.to_vec2()?;
    Ok(Some(
        scores
            .into_iter()
            .zip(ids)
            .map(|(row, &id)| {
                let here = row[id as usize];
                row.iter().map(|s| s - here).collect()
            })
            .collect(),
    ))
}

/// In every row of `rows`, the swap (to a token below `vocab`) of the
/// largest positive finite gain; whether any was made.
fn swap_best(ids: &mut [u32], rows: usize, vocab: usize, gain: &[Vec<f32>]) -> bool {
    let per = ids.len() / rows;
    let mut swapped = false;
    for r in 0..rows {
        let mut best: Option<(usize, usize, f32)> = None;
        for (p, row) in gain.iter().enumerate().skip(r * per).take(per) {
            for (v, &g) in row.iter().enumerate().take(vocab) {
                if g.is_finite() && g > 0.0 && best.is_none_or(|b| g > b.2) {
                    best = Some((p, v, g));
                }
            }
        }
        if let Some((p, v, _)) = best {
            ids[p] = v as u32;
            swapped = true;
        }
    }
    swapped
}

/// How many tokens of `found`'s rows differ from the ground batch's.
pub(super) fn changed(ground: &HostBatch, found: &Found) -> usize {
    let (HostInput::Tokens { ids: a, dims }, HostInput::Tokens { ids: b, .. }) =
        (&ground.input, &found.batch.input)
    else {
        return 0;
    };
    let per = a.len() / dims.first().copied().unwrap_or(1).max(1);
    found
        .rows
        .iter()
        .enumerate()
        .map(|(k, &r)| {
            a[r * per..(r + 1) * per]
                .iter()
                .zip(&b[k * per..(k + 1) * per])
                .filter(|(x, y)| x != y)
                .count()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_swaps_its_token_of_the_largest_gain() {
        let mut ids = vec![0u32, 1, 2, 3];
        // Two rows of two positions, three tokens.
        let gain = vec![
            vec![0.0, 0.5, 2.0],
            vec![-1.0, 0.0, 1.0],
            vec![0.0, 0.0, 0.0],
            vec![0.3, f32::INFINITY, 0.0],
        ];
        assert!(swap_best(&mut ids, 2, 3, &gain));
        assert_eq!(ids, vec![2, 1, 2, 0]);
        // Inside the vocabulary only.
        let mut ids = vec![0u32, 1, 2, 3];
        assert!(swap_best(&mut ids, 2, 2, &gain));
        assert_eq!(ids, vec![1, 1, 2, 0]);
        let none = vec![vec![0.0; 3]; 4];
        assert!(!swap_best(&mut ids, 2, 3, &none));
    }
}
