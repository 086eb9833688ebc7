//! RNN family: stacked vanilla (tanh), LSTM or GRU cells, in PyTorch's
//! parameterization (input and hidden projections each with a bias), and a
//! linear head on the last hidden state of the top layer.

use super::layers::Linear;
use super::{Model, Tracer};
use crate::finding::OpKind;
use crate::kernels;
use crate::spec::{CellKind, RnnSpec};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

struct Layer {
    name: String,
    input: Linear,
    hidden: Linear,
}

pub struct Rnn {
    cell: CellKind,
    hidden: usize,
    layers: Vec<Layer>,
    head: Linear,
}

impl Rnn {
    pub fn new(spec: &RnnSpec, vb: VarBuilder) -> Result<Self> {
        let gates = match spec.cell {
            CellKind::Rnn => 1,
            CellKind::Lstm => 4,
            CellKind::Gru => 3,
        };
        let h = spec.hidden;
        let mut layers = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            let name = format!("layer{i}");
            let vb = vb.pp(&name);
            let fan_in = if i == 0 { spec.features } else { h };
            layers.push(Layer {
                input: Linear::new(vb.pp("input"), &spec.init, fan_in, gates * h)?,
                hidden: Linear::new(vb.pp("hidden"), &spec.init, h, gates * h)?,
                name,
            });
        }
        let head = Linear::new(vb.pp("head"), &spec.init, h, spec.classes)?;
        Ok(Rnn {
            cell: spec.cell,
            hidden: h,
            layers,
            head,
        })
    }

    /// Runs one layer over the sequence of inputs (B, features) and returns
    /// every hidden state. Steps stay separate tensors: a per-step slice of
    /// one (B, S, ·) tensor would have a backward pass that materializes the
    /// whole tensor's gradient at every step (quadratic in the length).
    /// `projected`: the inputs are already x·W_ihᵀ + b_ih.
    fn layer(
        &self,
        l: &Layer,
        xs: &[Tensor],
        projected: bool,
        tr: &mut Tracer,
    ) -> Result<Vec<Tensor>> {
        let Some(first) = xs.first() else {
            return Ok(Vec::new());
        };
        let hd = self.hidden;
        let mut h = Tensor::zeros((first.dim(0)?, hd), first.dtype(), first.device())?;
        let mut c = h.clone();
        let mut outputs = Vec::with_capacity(xs.len());
        for (t, x) in xs.iter().enumerate() {
            let xt = if projected {
                x.clone()
            } else {
                l.input.forward(x)?
            };
            let hw = l.hidden.forward(&h)?;
            match self.cell {
                CellKind::Rnn => {
                    let pre = tr.record_with_as(
                        || format!("{}.t{t}.gates", l.name),
                        OpKind::Recurrent,
                        (xt + hw)?,
                    )?;
                    h = kernels::tanh(&pre)?;
                }
                CellKind::Lstm => {
                    let gates = tr.record_with_as(
                        || format!("{}.t{t}.gates", l.name),
                        OpKind::Recurrent,
                        (xt + hw)?,
                    )?;
                    let act = kernels::lstm_activate(&gates)?;
                    c = tr.record_with_as(
                        || format!("{}.t{t}.c", l.name),
                        OpKind::Recurrent,
                        kernels::lstm_c(&act, &c)?,
                    )?;
                    h = kernels::lstm_h(&act, &c)?;
                }
                CellKind::Gru => {
                    let rz = (xt.narrow(1, 0, 2 * hd)? + hw.narrow(1, 0, 2 * hd)?)?;
                    let rz = tr.record_with_as(
                        || format!("{}.t{t}.gates", l.name),
                        OpKind::Recurrent,
                        rz,
                    )?;
                    let n = kernels::gru_n(&rz, &xt, &hw)?;
                    h = kernels::gru_h(&rz, &n, &h)?;
                }
            }
            h = tr.record_with_as(|| format!("{}.t{t}.h", l.name), OpKind::Recurrent, h)?;
            outputs.push(h.clone());
        }
        Ok(outputs)
    }

    /// One layer on the fused kernels: (B, S, in) → (B, S, H) as one op
    /// (`kernels::tanh_rnn_layer`, `lstm_layer`, `gru_layer`), the input
    /// projection one product over every step. A traced run takes the per-step ops instead, to record
    /// every step's gates, c and h; from the same projection they compute
    /// the same forward bits. (Its per-step slices of the projection cost
    /// a full-size gradient each, quadratic in the length: acceptable for
    /// the one re-run that localizes a failure.)
    fn whole_layer(&self, l: &Layer, x: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        if !tr.enabled() {
            let (input, hidden) = (&l.input, &l.hidden);
            let op = match self.cell {
                CellKind::Rnn => kernels::tanh_rnn_layer,
                CellKind::Lstm => kernels::lstm_layer,
                CellKind::Gru => kernels::gru_layer,
            };
            return op(
                x,
                input.weight(),
                input.bias(),
                hidden.weight(),
                hidden.bias(),
            );
        }
        let xw = l.input.forward(x)?;
        let steps = (0..xw.dim(1)?)
            .map(|t| xw.narrow(1, t, 1)?.squeeze(1))
            .collect::<Result<Vec<_>>>()?;
        Tensor::stack(&self.layer(l, &steps, true, tr)?, 1)
    }
}

impl Model for Rnn {
    fn forward(&self, input: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        let steps = input.dim(1)?;
        if steps == 0 {
            candle_core::bail!("rnn: empty sequence");
        }
        let last = if kernels::fused_for(input) {
            let mut x = input.clone();
            for l in &self.layers {
                x = self.whole_layer(l, &x, tr)?;
            }
            x.narrow(1, steps - 1, 1)?.squeeze(1)?
        } else {
            let mut xs = (0..steps)
                .map(|t| input.narrow(1, t, 1)?.squeeze(1))
                .collect::<Result<Vec<_>>>()?;
            for l in &self.layers {
                xs = self.layer(l, &xs, false, tr)?;
            }
            xs.pop().expect("steps > 0")
        };
        tr.record_as("head.linear", OpKind::Linear, self.head.forward(&last)?)
    }
}
