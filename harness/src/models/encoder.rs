//! BERT-style encoder family over padded token sequences: token and
//! learned position embeddings with a layer norm, post-norm blocks of
//! masked self-attention and a GELU MLP, a head on the first token. Token 0
//! is padding; the mask keeps attention off the padded keys, additively as
//! BERT does or by filling them with -inf.

use super::layers::{self, LayerNorm, Linear};
use super::{Model, Tracer};
use crate::finding::OpKind;
use crate::kernels;
use crate::spec::{AttentionScale, EncoderSpec, MaskKind};
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;

struct Block {
    name: String,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln1: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    ln2: LayerNorm,
}

pub struct Encoder {
    embed: Tensor,
    pos: Tensor,
    embed_ln: LayerNorm,
    blocks: Vec<Block>,
    head: Linear,
    heads: usize,
    scale: Option<f64>,
    mask: MaskKind,
}

impl Encoder {
    pub fn new(spec: &EncoderSpec, vb: VarBuilder) -> Result<Self> {
        let d = spec.d_model;
        let init = &spec.init;
        let normal = |stdev| candle_nn::Init::Randn { mean: 0.0, stdev };
        let hidden = spec.mlp_ratio * d;
        let mut blocks = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            let name = format!("layer{i}");
            let vb = vb.pp(&name);
            blocks.push(Block {
                q: Linear::new(vb.pp("attn.q"), init, d, d)?,
                k: Linear::new(vb.pp("attn.k"), init, d, d)?,
                v: Linear::new(vb.pp("attn.v"), init, d, d)?,
                o: Linear::new(vb.pp("attn.o"), init, d, d)?,
                ln1: LayerNorm::new(vb.pp("ln1"), d, spec.norm_eps)?,
                fc1: Linear::new(vb.pp("mlp.fc1"), init, d, hidden)?,
                fc2: Linear::new(vb.pp("mlp.fc2"), init, hidden, d)?,
                ln2: LayerNorm::new(vb.pp("ln2"), d, spec.norm_eps)?,
                name,
            });
        }
        Ok(Encoder {
            embed: vb
                .pp("embed")
                .get_with_hints((spec.vocab, d), "weight", normal(1.0))?,
            pos: vb
                .pp("pos")
                .get_with_hints((spec.seq_len, d), "weight", normal(0.02))?,
            embed_ln: LayerNorm::new(vb.pp("embed_ln"), d, spec.norm_eps)?,
            blocks,
            head: Linear::new(vb.pp("head"), init, d, spec.classes)?,
            heads: spec.heads,
            scale: match spec.attention_scale {
                AttentionScale::InvSqrtD => Some(1.0 / ((d / spec.heads) as f64).sqrt()),
                AttentionScale::None => None,
            },
            mask: spec.mask,
        })
    }

    /// The softmax of the attention logits masked at the padded keys;
    /// `keep` is (B, S) of 1 for tokens and 0 for padding, in the compute dtype.
    fn masked_softmax(
        &self,
        scores: &Tensor,
        keep: &Tensor,
        tr: &mut Tracer,
        name: &str,
    ) -> Result<Tensor> {
        let (b, s) = keep.dims2()?;
        let keys = keep.reshape((b, 1, 1, s))?;
        match self.mask {
            MaskKind::Additive { value } => {
                // BERT's (1 - keep) · value, in the compute dtype.
                let add = keys.affine(-1.0, 1.0)?.affine(value, 0.0)?;
                let add = tr.record_with_as(|| format!("{name}.attn.mask"), OpKind::Mask, add)?;
                kernels::key_masked_softmax(scores, &add)
            }
            MaskKind::NegInf => {
                let blocked = Tensor::new(f32::NEG_INFINITY, scores.device())?
                    .to_dtype(scores.dtype())?
                    .broadcast_as(scores.shape())?;
                let masked = keys
                    .ne(0.0)?
                    .broadcast_as(scores.shape())?
                    .where_cond(scores, &blocked)?;
                layers::softmax(&masked)
            }
        }
    }

    fn attention(&self, l: &Block, x: &Tensor, keep: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
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
        let scores = kernels::attention_scores(&q, &k, self.heads, self.scale)?;
        let scores =
            tr.record_with_as(|| format!("{}.attn.scores", l.name), OpKind::Scores, scores)?;
        let probs = self.masked_softmax(&scores, keep, tr, &l.name)?;
        let probs = tr.record_with_as(
            || format!("{}.attn.softmax", l.name),
            OpKind::Softmax,
            probs,
        )?;
        let ctx = kernels::attention_context(&probs, &v, self.heads)?;
        tr.record_with_as(
            || format!("{}.attn.out", l.name),
            OpKind::Linear,
            l.o.forward(&ctx)?,
        )
    }
}

impl Model for Encoder {
    fn forward(&self, input: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        input.dims2()?; // (B, S) ids, or a shape error here
        let ids = input.to_dtype(DType::U32)?;
        let x = kernels::add_positions(&kernels::embedding(&self.embed, &ids)?, &self.pos)?;
        let mut x = tr.record_as("embed", OpKind::Norm, self.embed_ln.forward(&x)?)?;
        let keep = ids.ne(0u32)?.to_dtype(x.dtype())?;
        for l in &self.blocks {
            let a = self.attention(l, &x, &keep, tr)?;
            x = tr.record_with_as(
                || format!("{}.ln1", l.name),
                OpKind::Norm,
                l.ln1.forward(&(&x + a)?)?,
            )?;
            let h = tr.record_with_as(
                || format!("{}.mlp.fc1", l.name),
                OpKind::Activation,
                kernels::gelu(&l.fc1.forward(&x)?)?,
            )?;
            let m = tr.record_with_as(
                || format!("{}.mlp.fc2", l.name),
                OpKind::Linear,
                l.fc2.forward(&h)?,
            )?;
            x = tr.record_with_as(
                || format!("{}.ln2", l.name),
                OpKind::Norm,
                l.ln2.forward(&(&x + m)?)?,
            )?;
        }
        // The first token's state stands for the sequence ([CLS]).
        let first = tr.record_as("head.first", OpKind::Other, x.narrow(1, 0, 1)?.squeeze(1)?)?;
        tr.record_as("head.linear", OpKind::Linear, self.head.forward(&first)?)
    }
}
