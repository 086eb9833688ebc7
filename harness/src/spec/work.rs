//! How much arithmetic one sample's forward pass takes: the multiply-adds
//! of the products, convolutions and attention of a built-in family (a
//! placement's measure of size, not a timing; element-wise ops left out).

use super::{CellKind, HeadKind, ModelSpec, Pool, TokenOrContinuous};

impl ModelSpec {
    /// Multiply-adds of one sample's forward pass; `None` for a user's
    /// model, whose layers the case does not describe.
    pub fn multiply_adds(&self) -> Option<u64> {
        let n = |v: usize| v as u64;
        Some(match self {
            ModelSpec::Cnn(c) => {
                let (mut h, mut w, mut ch) = (n(c.height), n(c.width), n(c.channels));
                let mut total = 0;
                for b in &c.blocks {
                    total += h * w * ch * n(b.channels) * n(b.kernel * b.kernel);
                    ch = n(b.channels);
                    if b.pool != Pool::None {
                        (h, w) = (h / 2, w / 2);
                    }
                }
                total + ch * n(c.classes)
            }
            ModelSpec::Transformer(t) => {
                let input = match t.input {
                    TokenOrContinuous::Tokens { .. } => 0,
                    TokenOrContinuous::Continuous { features } => n(features * t.d_model),
                };
                let head_positions = match t.head {
                    HeadKind::Classify => 1,
                    HeadKind::PerToken => n(t.seq_len),
                };
                let (d, s) = (n(t.d_model), n(t.seq_len));
                let layer = (4 + 2 * n(t.mlp_ratio)) * d * d + 2 * s * d;
                s * (input + n(t.layers) * layer) + head_positions * d * n(t.classes)
            }
            ModelSpec::Rnn(r) => {
                let gates = match r.cell {
                    CellKind::Rnn => 1,
                    CellKind::Lstm => 4,
                    CellKind::Gru => 3,
                };
                let (f, h) = (n(r.features), n(r.hidden));
                let first = gates * (f + h) * h;
                let rest = n(r.layers.saturating_sub(1)) * gates * 2 * h * h;
                n(r.seq_len) * (first + rest) + h * n(r.classes)
            }
            ModelSpec::Decoder(m) => {
                let (d, s) = (n(m.d_model), n(m.seq_len));
                let kv = d * n(m.kv_heads) / n(m.heads.max(1));
                let layer = 2 * d * d + 2 * d * kv + 3 * n(m.mlp_ratio) * d * d + 2 * s * d;
                s * (n(m.layers) * layer + d * n(m.vocab))
            }
            ModelSpec::Encoder(e) => {
                let (d, s) = (n(e.d_model), n(e.seq_len));
                let layer = (4 + 2 * n(e.mlp_ratio)) * d * d + 2 * s * d;
                s * n(e.layers) * layer + d * n(e.classes)
            }
            ModelSpec::Custom(_) => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::{Case, Size, FAMILIES};

    #[test]
    fn each_family_grows_with_its_size_and_counts_the_large_cnn_by_hand() {
        for family in FAMILIES {
            let at = |size| {
                Case::example_sized(family, size)
                    .unwrap()
                    .model
                    .multiply_adds()
                    .unwrap()
            };
            assert!(at(Size::Small) < at(Size::Default), "{family}");
            assert!(at(Size::Default) < at(Size::Large), "{family}");
        }
        // 32×32×3→16 and 16×16×16→32 convolutions of 3×3, a 32→4 head.
        let large = Case::example_sized("cnn", Size::Large).unwrap();
        let want = 32 * 32 * 3 * 16 * 9 + 16 * 16 * 16 * 32 * 9 + 32 * 4;
        assert_eq!(large.model.multiply_adds(), Some(want));
    }
}
