//! CNN family: conv blocks (conv → batch-norm → activation → residual →
//! pool), global average pooling and a linear head.

use super::layers::{self, BatchNorm2d, Conv2d, Linear};
use super::{Model, Tracer};
use crate::finding::OpKind;
use crate::kernels;
use crate::spec::{Activation, CnnSpec, Pool};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

struct Block {
    name: String,
    conv: Conv2d,
    bn: Option<BatchNorm2d>,
    activation: Activation,
    residual: bool,
    pool: Pool,
}

pub struct Cnn {
    blocks: Vec<Block>,
    head: Linear,
}

impl Cnn {
    pub fn new(spec: &CnnSpec, vb: VarBuilder) -> Result<Self> {
        let mut in_ch = spec.channels;
        let mut blocks = Vec::with_capacity(spec.blocks.len());
        for (i, b) in spec.blocks.iter().enumerate() {
            let name = format!("block{i}");
            let vb = vb.pp(&name);
            let conv = Conv2d::new(vb.pp("conv"), &spec.init, in_ch, b.channels, b.kernel)?;
            let bn = match b.batch_norm_eps {
                Some(eps) => Some(BatchNorm2d::new(vb.pp("bn"), b.channels, eps)?),
                None => None,
            };
            blocks.push(Block {
                name,
                conv,
                bn,
                activation: b.activation,
                residual: b.residual,
                pool: b.pool,
            });
            in_ch = b.channels;
        }
        let head = Linear::new(vb.pp("head"), &spec.init, in_ch, spec.classes)?;
        Ok(Cnn { blocks, head })
    }
}

impl Model for Cnn {
    fn forward(&self, input: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        let mut x = input.clone();
        for b in &self.blocks {
            let skip = x.clone();
            let mut y = tr.record_with_as(
                || format!("{}.conv", b.name),
                OpKind::Conv,
                b.conv.forward(&x)?,
            )?;
            if let Some(bn) = &b.bn {
                y =
                    tr.record_with_as(|| format!("{}.bn", b.name), OpKind::Norm, bn.forward(&y)?)?;
            }
            // Activation and max pooling as one op where nothing comes
            // between them: the activated tensor is then never stored. A
            // traced run keeps them apart to record both stages; the values
            // are the same bits.
            if !tr.enabled() && !b.residual && b.pool == Pool::Max {
                let pooled = match b.activation {
                    Activation::Relu => Some(kernels::relu_max_pool2x2(&y)?),
                    Activation::Gelu => Some(kernels::gelu_max_pool2x2(&y)?),
                    _ => None,
                };
                if let Some(pooled) = pooled {
                    x = pooled;
                    continue;
                }
            }
            y = tr.record_with_as(
                || format!("{}.act", b.name),
                OpKind::Activation,
                layers::activate(&y, b.activation)?,
            )?;
            if b.residual {
                y = tr.record_with_as(
                    || format!("{}.residual", b.name),
                    OpKind::Residual,
                    (y + skip)?,
                )?;
            }
            y = match b.pool {
                Pool::Max => tr.record_with_as(
                    || format!("{}.pool", b.name),
                    OpKind::Pool,
                    layers::max_pool2x2(&y)?,
                )?,
                Pool::Avg => tr.record_with_as(
                    || format!("{}.pool", b.name),
                    OpKind::Pool,
                    layers::avg_pool2x2(&y)?,
                )?,
                Pool::None => y,
            };
            x = y;
        }
        let pooled = tr.record_as("head.pool", OpKind::Pool, layers::global_avg_pool(&x)?)?;
        tr.record_as("head.linear", OpKind::Linear, self.head.forward(&pooled)?)
    }
}
