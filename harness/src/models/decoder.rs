//! Llama-style decoder family: token embedding, pre-norm blocks of RMSNorm →
//! grouped-query causal self-attention with rotary positions → RMSNorm →
//! SwiGLU MLP, a final RMSNorm and a head over the vocabulary at every
//! position, trained on the next token. Written on nanhunt's kernels:
//! candle-nn's fused `rms_norm` and `rope` have no backward pass.

use super::layers::{Linear, RmsNorm};
use super::{Model, Tracer};
use crate::finding::OpKind;
use crate::kernels;
use crate::spec::{AttentionScale, DecoderSpec};
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;

struct Block {
    name: String,
    ln1: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

pub struct Decoder {
    embed: Tensor,
    blocks: Vec<Block>,
    final_norm: RmsNorm,
    head: Linear,
    heads: usize,
    kv_heads: usize,
    scale: Option<f64>,
    rope_theta: f64,
}

impl Decoder {
    pub fn new(spec: &DecoderSpec, vb: VarBuilder) -> Result<Self> {
        let d = spec.d_model;
        let hd = d / spec.heads;
        let kv = spec.kv_heads * hd;
        let init = &spec.init;
        let embed = vb.pp("embed").get_with_hints(
            (spec.vocab, d),
            "weight",
            candle_nn::Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
        )?;
        let hidden = spec.mlp_ratio * d;
        let mut blocks = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            let name = format!("layer{i}");
            let vb = vb.pp(&name);
            blocks.push(Block {
                ln1: RmsNorm::new(vb.pp("ln1"), d, spec.rms_eps)?,
                q: Linear::new(vb.pp("attn.q"), init, d, d)?,
                k: Linear::new(vb.pp("attn.k"), init, d, kv)?,
                v: Linear::new(vb.pp("attn.v"), init, d, kv)?,
                o: Linear::new(vb.pp("attn.o"), init, d, d)?,
                ln2: RmsNorm::new(vb.pp("ln2"), d, spec.rms_eps)?,
                gate: Linear::new(vb.pp("mlp.gate"), init, d, hidden)?,
                up: Linear::new(vb.pp("mlp.up"), init, d, hidden)?,
                down: Linear::new(vb.pp("mlp.down"), init, hidden, d)?,
                name,
            });
        }
        Ok(Decoder {
            embed,
            blocks,
            final_norm: RmsNorm::new(vb.pp("final_norm"), d, spec.rms_eps)?,
            head: Linear::new(vb.pp("head"), init, d, spec.vocab)?,
            heads: spec.heads,
            kv_heads: spec.kv_heads,
            scale: match spec.attention_scale {
                AttentionScale::InvSqrtD => Some(1.0 / (hd as f64).sqrt()),
                AttentionScale::None => None,
            },
            rope_theta: spec.rope_theta,
        })
    }

    /// cos and sin of each position's angle per rotated pair, (S, hd/2).
    fn rope_tables(&self, s: usize, hd: usize, like: &Tensor) -> Result<(Tensor, Tensor)> {
        let half = hd / 2;
        let angles: Vec<f64> = (0..s)
            .flat_map(|t| {
                (0..half).map(move |i| t as f64 * self.rope_theta.powf(-2.0 * i as f64 / hd as f64))
            })
            .collect();
        let a = Tensor::from_vec(angles, (s, half), like.device())?;
        Ok((
            a.cos()?.to_dtype(like.dtype())?,
            a.sin()?.to_dtype(like.dtype())?,
        ))
    }

    fn attention(
        &self,
        l: &Block,
        x: &Tensor,
        tables: &(Tensor, Tensor),
        tr: &mut Tracer,
    ) -> Result<Tensor> {
        let (cos, sin) = tables;
        let q = tr.record_with_as(
            || format!("{}.attn.q", l.name),
            OpKind::Linear,
            l.q.forward(x)?,
        )?;
        let k = tr.record_with_as(
            || format!("{}.attn.k", l.name),
            OpKind::Linear,
            l.k.forward(x)?,
        )?;
        let v = tr.record_with_as(
            || format!("{}.attn.v", l.name),
            OpKind::Linear,
            l.v.forward(x)?,
        )?;
        let q = kernels::rope_heads(&q, self.heads, cos, sin)?;
        let k = kernels::rope_heads(&k, self.kv_heads, cos, sin)?;
        let heads = (self.heads, self.kv_heads);
        let scores = kernels::grouped_attention_scores(&q, &k, heads, self.scale)?;
        let scores =
            tr.record_with_as(|| format!("{}.attn.scores", l.name), OpKind::Scores, scores)?;
        // The keys after each query are -inf: a causal mask, then the softmax.
        let probs = tr.record_with_as(
            || format!("{}.attn.softmax", l.name),
            OpKind::Softmax,
            kernels::causal_softmax(&scores)?,
        )?;
        let ctx = kernels::grouped_attention_context(&probs, &v, heads)?;
        tr.record_with_as(
            || format!("{}.attn.out", l.name),
            OpKind::Linear,
            l.o.forward(&ctx)?,
        )
    }

    /// SwiGLU: down(silu(gate(x)) · up(x)).
    fn mlp(&self, l: &Block, x: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        let h = kernels::swiglu(&l.gate.forward(x)?, &l.up.forward(x)?)?;
        let h = tr.record_with_as(|| format!("{}.mlp.swiglu", l.name), OpKind::Activation, h)?;
        tr.record_with_as(
            || format!("{}.mlp.down", l.name),
            OpKind::Linear,
            l.down.forward(&h)?,
        )
    }
}

impl Model for Decoder {
    fn forward(&self, input: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        let (_, s) = input.dims2()?;
        let x = kernels::embedding(&self.embed, &input.to_dtype(DType::U32)?)?;
        let mut x = tr.record_as("embed", OpKind::Embedding, x)?;
        let hd = x.dim(2)? / self.heads;
        let tables = self.rope_tables(s, hd, &x)?;
        for l in &self.blocks {
            let h = tr.record_with_as(
                || format!("{}.ln1", l.name),
                OpKind::Norm,
                l.ln1.forward(&x)?,
            )?;
            x = (&x + self.attention(l, &h, &tables, tr)?)?;
            let h = tr.record_with_as(
                || format!("{}.ln2", l.name),
                OpKind::Norm,
                l.ln2.forward(&x)?,
            )?;
            x = (&x + self.mlp(l, &h, tr)?)?;
        }
        let x = tr.record_as("final_norm", OpKind::Norm, self.final_norm.forward(&x)?)?;
        tr.record_as("head.linear", OpKind::Linear, self.head.forward(&x)?)
    }
}
