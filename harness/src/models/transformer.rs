//! Transformer encoder family: token or continuous input, learned positions,
//! multi-head self-attention and a GELU MLP per layer, pre-/post-/no
//! layer-norm, and a classification or per-token head.

use super::layers::{self, LayerNorm, Linear};
use super::{Model, Tracer};
use crate::finding::OpKind;
use crate::kernels;
use crate::spec::{AttentionScale, HeadKind, NormPlacement, TokenOrContinuous, TransformerSpec};
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;

enum Embed {
    Tokens(Tensor),
    Continuous(Linear),
}

struct Layer {
    name: String,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln1: Option<LayerNorm>,
    ln2: Option<LayerNorm>,
    fc1: Linear,
    fc2: Linear,
}

pub struct Transformer {
    embed: Embed,
    pos: Tensor,
    layers: Vec<Layer>,
    final_ln: Option<LayerNorm>,
    head: Linear,
    heads: usize,
    norm: NormPlacement,
    scale: Option<f64>,
    causal: bool,
    head_kind: HeadKind,
}

impl Transformer {
    pub fn new(spec: &TransformerSpec, vb: VarBuilder) -> Result<Self> {
        let d = spec.d_model;
        let init = &spec.init;
        let embed = match spec.input {
            TokenOrContinuous::Tokens { vocab } => Embed::Tokens(vb.pp("embed").get_with_hints(
                (vocab, d),
                "weight",
                candle_nn::Init::Randn {
                    mean: 0.0,
                    stdev: 1.0,
                },
            )?),
            TokenOrContinuous::Continuous { features } => {
                Embed::Continuous(Linear::new(vb.pp("embed"), init, features, d)?)
            }
        };
        let pos = vb.pp("pos").get_with_hints(
            (spec.seq_len, d),
            "weight",
            candle_nn::Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            },
        )?;
        let with_norm = spec.norm != NormPlacement::None;
        let mut layers = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            let name = format!("layer{i}");
            let vb = vb.pp(&name);
            let ln = |n: &str| -> Result<Option<LayerNorm>> {
                if with_norm {
                    Ok(Some(LayerNorm::new(vb.pp(n), d, spec.norm_eps)?))
                } else {
                    Ok(None)
                }
            };
            let hidden = spec.mlp_ratio * d;
            layers.push(Layer {
                q: Linear::new(vb.pp("attn.q"), init, d, d)?,
                k: Linear::new(vb.pp("attn.k"), init, d, d)?,
                v: Linear::new(vb.pp("attn.v"), init, d, d)?,
                o: Linear::new(vb.pp("attn.o"), init, d, d)?,
                ln1: ln("ln1")?,
                ln2: ln("ln2")?,
                fc1: Linear::new(vb.pp("mlp.fc1"), init, d, hidden)?,
                fc2: Linear::new(vb.pp("mlp.fc2"), init, hidden, d)?,
                name,
            });
        }
        let final_ln = if spec.norm == NormPlacement::Pre {
            Some(LayerNorm::new(vb.pp("final_ln"), d, spec.norm_eps)?)
        } else {
            None
        };
        let head = Linear::new(vb.pp("head"), init, d, spec.classes)?;
        let scale = match spec.attention_scale {
            AttentionScale::InvSqrtD => Some(1.0 / ((d / spec.heads) as f64).sqrt()),
            AttentionScale::None => None,
        };
        Ok(Transformer {
            embed,
            pos,
            layers,
            final_ln,
            head,
            heads: spec.heads,
            norm: spec.norm,
            scale,
            causal: spec.causal,
            head_kind: spec.head,
        })
    }

    fn attention(&self, l: &Layer, x: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
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
        // Causal: the keys after each query are -inf (a mask, then the softmax).
        let probs = if self.causal {
            kernels::causal_softmax(&scores)?
        } else {
            layers::softmax(&scores)?
        };
        let probs = tr.record_with_as(
            || format!("{}.attn.softmax", l.name),
            OpKind::Softmax,
            probs,
        )?;
        let ctx = kernels::attention_context(&probs, &v, self.heads)?;
        let out = tr.record_with_as(
            || format!("{}.attn.out", l.name),
            OpKind::Linear,
            l.o.forward(&ctx)?,
        )?;
        Ok(out)
    }

    fn mlp(&self, l: &Layer, x: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        let h = tr.record_with_as(
            || format!("{}.mlp.fc1", l.name),
            OpKind::Activation,
            kernels::gelu(&l.fc1.forward(x)?)?,
        )?;
        let out = tr.record_with_as(
            || format!("{}.mlp.fc2", l.name),
            OpKind::Linear,
            l.fc2.forward(&h)?,
        )?;
        Ok(out)
    }

    fn norm(
        ln: &Option<LayerNorm>,
        x: &Tensor,
        name: impl FnOnce() -> String,
        tr: &mut Tracer,
    ) -> Result<Tensor> {
        match ln {
            Some(ln) => tr.record_with_as(name, OpKind::Norm, ln.forward(x)?),
            None => Ok(x.clone()),
        }
    }
}

impl Model for Transformer {
    fn forward(&self, input: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        let x = match &self.embed {
            Embed::Tokens(table) => kernels::embedding(table, &input.to_dtype(DType::U32)?)?,
            Embed::Continuous(lin) => lin.forward(input)?,
        };
        let x = kernels::add_positions(&x, &self.pos)?;
        let mut x = tr.record_as("embed", OpKind::Embedding, x)?;
        for l in &self.layers {
            x = match self.norm {
                NormPlacement::Pre => {
                    let h = Self::norm(&l.ln1, &x, || format!("{}.ln1", l.name), tr)?;
                    let x = (&x + self.attention(l, &h, tr)?)?;
                    let h = Self::norm(&l.ln2, &x, || format!("{}.ln2", l.name), tr)?;
                    (&x + self.mlp(l, &h, tr)?)?
                }
                NormPlacement::Post | NormPlacement::None => {
                    let x = (&x + self.attention(l, &x, tr)?)?;
                    let x = Self::norm(&l.ln1, &x, || format!("{}.ln1", l.name), tr)?;
                    let x = (&x + self.mlp(l, &x, tr)?)?;
                    Self::norm(&l.ln2, &x, || format!("{}.ln2", l.name), tr)?
                }
            };
        }
        let x = Self::norm(&self.final_ln, &x, || "final_ln".to_string(), tr)?;
        let out = match self.head_kind {
            HeadKind::Classify => {
                let pooled =
                    tr.record_as("head.pool", OpKind::Pool, kernels::mean_positions(&x)?)?;
                self.head.forward(&pooled)?
            }
            HeadKind::PerToken => self.head.forward(&x)?,
        };
        tr.record_as("head.linear", OpKind::Linear, out)
    }
}
