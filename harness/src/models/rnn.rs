//! RNN family: stacked vanilla (tanh), LSTM or GRU cells, in PyTorch's
//! parameterization (input and hidden projections each with a bias), and a
//! linear head on the last hidden state of the top layer.

use super::layers::{sigmoid, Linear};
use super::{Model, Tracer};
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

    /// Runs one layer over the sequence; returns every hidden state (B, S, H).
    fn layer(&self, l: &Layer, x: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let hd = self.hidden;
        // Input projections of all time steps in one matmul.
        let xw = l.input.forward(x)?;
        let mut h = Tensor::zeros((b, hd), x.dtype(), x.device())?;
        let mut c = h.clone();
        let mut outputs = Vec::with_capacity(s);
        for t in 0..s {
            let xt = xw.narrow(1, t, 1)?.squeeze(1)?;
            let hw = l.hidden.forward(&h)?;
            match self.cell {
                CellKind::Rnn => {
                    let pre = tr.record_with(|| format!("{}.t{t}.gates", l.name), (xt + hw)?)?;
                    h = pre.tanh()?;
                }
                CellKind::Lstm => {
                    let gates = tr.record_with(|| format!("{}.t{t}.gates", l.name), (xt + hw)?)?;
                    let i = sigmoid(&gates.narrow(1, 0, hd)?)?;
                    let f = sigmoid(&gates.narrow(1, hd, hd)?)?;
                    let g = gates.narrow(1, 2 * hd, hd)?.tanh()?;
                    let o = sigmoid(&gates.narrow(1, 3 * hd, hd)?)?;
                    c = tr.record_with(|| format!("{}.t{t}.c", l.name), ((f * &c)? + (i * g)?)?)?;
                    h = (o * c.tanh()?)?;
                }
                CellKind::Gru => {
                    let rz = (xt.narrow(1, 0, 2 * hd)? + hw.narrow(1, 0, 2 * hd)?)?;
                    let rz = tr.record_with(|| format!("{}.t{t}.gates", l.name), rz)?;
                    let r = sigmoid(&rz.narrow(1, 0, hd)?)?;
                    let z = sigmoid(&rz.narrow(1, hd, hd)?)?;
                    let n =
                        (xt.narrow(1, 2 * hd, hd)? + (r * hw.narrow(1, 2 * hd, hd)?)?)?.tanh()?;
                    // h' = (1 - z) n + z h = n + z (h - n)
                    h = (&n + (z * (&h - &n)?)?)?;
                }
            }
            h = tr.record_with(|| format!("{}.t{t}.h", l.name), h)?;
            outputs.push(h.clone());
        }
        Tensor::stack(&outputs, 1)
    }
}

impl Model for Rnn {
    fn forward(&self, input: &Tensor, tr: &mut Tracer) -> Result<Tensor> {
        let mut x = input.clone();
        for l in &self.layers {
            x = self.layer(l, &x, tr)?;
        }
        let s = x.dim(1)?;
        let last = x.narrow(1, s - 1, 1)?.squeeze(1)?;
        tr.record("head.linear", self.head.forward(&last)?)
    }
}
