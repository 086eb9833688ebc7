//! Gradient coverage: which trainable tensors a backward pass reached, and
//! where the flow stopped for the rest.
//!
//! candle keeps no error for a tensor that gets no gradient: a model built
//! on an op without a backward pass (the fused `layer_norm`, `rms_norm`,
//! `softmax_last_dim`, `rope` of candle-nn) trains the layers after the op
//! and silently freezes every layer before it. The runner, the guard,
//! `gradcheck` and `diagnose` report that as a `no_gradient` finding whose
//! [`GradientCoverage`] lists the frozen tensors by module, the share of
//! parameters they hold, the recorded stage where the flow stops, and the
//! ops of the linked candle that have no backward pass, with their
//! differentiable replacements.

mod cuts;

pub use crate::finding::{Cut, CutKind, FlowStop, FrozenModule, GradientCoverage, NoBackwardOp};
use crate::models::Record;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use std::sync::OnceLock;

/// A tensor (or module prefix) a user declared frozen: `name` matches
/// itself and every tensor under `name.`.
pub fn declared_frozen(name: &str, frozen: &[String]) -> bool {
    frozen
        .iter()
        .any(|p| name == p || (!p.is_empty() && cuts::under(name, p)))
}

/// The coverage of `grads` over the named trainable variables, `None`
/// when every one got a gradient. `records` are the tracer's stages (empty
/// without tracing).
pub fn of(
    names: &[String],
    vars: &[Var],
    grads: &GradStore,
    records: &[Record],
) -> Option<GradientCoverage> {
    let missing: Vec<usize> = (0..vars.len())
        .filter(|&i| grads.get(vars[i].as_tensor()).is_none())
        .collect();
    if missing.is_empty() {
        return None;
    }
    let parameters: usize = vars.iter().map(|v| v.elem_count()).sum();
    let mut modules: Vec<FrozenModule> = Vec::new();
    for &i in &missing {
        let (module, leaf) = match names[i].rsplit_once('.') {
            Some((m, l)) => (m.to_string(), l.to_string()),
            None => (String::new(), names[i].clone()),
        };
        let n = vars[i].elem_count();
        match modules.iter_mut().find(|m| m.module == module) {
            Some(m) => {
                m.tensors.push(leaf);
                m.parameters += n;
            }
            None => modules.push(FrozenModule {
                module,
                tensors: vec![leaf],
                parameters: n,
            }),
        }
    }
    let frozen_parameters: usize = missing.iter().map(|&i| vars[i].elem_count()).sum();
    let tensors: Vec<cuts::Tensor> = (0..vars.len())
        .map(|i| cuts::Tensor {
            name: &names[i],
            rank: vars[i].rank(),
            frozen: grads.get(vars[i].as_tensor()).is_none(),
        })
        .collect();
    let cuts = cuts::read(&tensors, &without_backward);
    Some(GradientCoverage {
        tensors: vars.len(),
        parameters,
        frozen_tensors: missing.len(),
        frozen_parameters,
        frozen_share: frozen_parameters as f64 / parameters.max(1) as f64,
        modules,
        stops_at: flow_stop(records, grads),
        no_backward_ops: explaining(&cuts),
        cuts,
    })
}

/// The last recorded stage without a gradient, and the stage after it.
fn flow_stop(records: &[Record], grads: &GradStore) -> Option<FlowStop> {
    let reached = |r: &Record| grads.get(r.grad_probe.as_tensor()).is_some();
    let i = records.iter().rposition(|r| !reached(r))?;
    Some(FlowStop {
        stage: records[i].name.clone(),
        next: records[i + 1..]
            .iter()
            .find(|r| reached(r))
            .map(|r| r.name.clone()),
    })
}

/// The ops of the linked candle without a backward pass that can make
/// `cuts`; all of them when there is no cut to read.
fn explaining(cuts: &[Cut]) -> Vec<NoBackwardOp> {
    let ops = no_backward_ops();
    if cuts.is_empty() {
        return ops.to_vec();
    }
    ops.iter()
        .filter(|o| cuts.iter().any(|c| c.ops.contains(&o.op)))
        .cloned()
        .collect()
}

/// A candidate op: what it is, its name, its replacement, and how to call
/// it on a (2, 4) input.
type Candidate = (
    cuts::Fused,
    &'static str,
    &'static str,
    fn(&Tensor) -> candle_core::Result<Tensor>,
);

const CANDIDATES: [Candidate; 6] = [
    (
        cuts::Fused::SoftmaxLastDim,
        "candle_nn::ops::softmax_last_dim",
        "candle_nn::ops::softmax(x, D::Minus1)",
        |x| candle_nn::ops::softmax_last_dim(x),
    ),
    (
        cuts::Fused::LayerNorm,
        "candle_nn::ops::layer_norm (and candle_nn::LayerNorm on contiguous input)",
        "candle_nn::ops::layer_norm_slow",
        |x| {
            let w = Tensor::ones(4, x.dtype(), x.device())?;
            let b = Tensor::zeros(4, x.dtype(), x.device())?;
            candle_nn::ops::layer_norm(x, &w, &b, 1e-5)
        },
    ),
    (
        cuts::Fused::RmsNorm,
        "candle_nn::ops::rms_norm (and candle_nn::RmsNorm on contiguous input)",
        "candle_nn::ops::rms_norm_slow",
        |x| {
            let w = Tensor::ones(4, x.dtype(), x.device())?;
            candle_nn::ops::rms_norm(x, &w, 1e-5)
        },
    ),
    (
        cuts::Fused::Rope,
        "candle_nn::rotary_emb::rope",
        "candle_nn::rotary_emb::rope_slow",
        |x| {
            let (cos, sin) = rope_tables(x)?;
            candle_nn::rotary_emb::rope(&x.reshape((1, 1, 2, 4))?, &cos, &sin)
        },
    ),
    (
        cuts::Fused::Rope,
        "candle_nn::rotary_emb::rope_i",
        "candle_nn::rotary_emb::rope_i_slow",
        |x| {
            let (cos, sin) = rope_tables(x)?;
            candle_nn::rotary_emb::rope_i(&x.reshape((1, 1, 2, 4))?, &cos, &sin)
        },
    ),
    (
        cuts::Fused::Rope,
        "candle_nn::rotary_emb::rope_thd",
        "candle_nn::rotary_emb::rope_slow on the (batch, heads, time, dim) transpose",
        |x| {
            let (cos, sin) = rope_tables(x)?;
            candle_nn::rotary_emb::rope_thd(&x.reshape((1, 2, 1, 4))?, &cos, &sin)
        },
    ),
];

/// cos/sin tables for 2 positions of a head dimension of 4.
fn rope_tables(x: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
    let t = Tensor::new(&[[0f32, 0.0], [1.0, 0.5]], x.device())?.to_dtype(x.dtype())?;
    Ok((t.cos()?, t.sin()?))
}

/// The names of the candidates of kind `fused` that give no gradient in
/// the linked candle.
fn without_backward(fused: cuts::Fused) -> Vec<String> {
    let ops = no_backward_ops();
    CANDIDATES
        .iter()
        .filter(|c| c.0 == fused && ops.iter().any(|o| o.op == c.1))
        .map(|c| c.1.to_string())
        .collect()
}

/// The candidates that give no gradient in the linked candle, checked once
/// per process on the CPU (a candle release that adds a backward pass
/// drops out of the list by itself).
pub fn no_backward_ops() -> &'static [NoBackwardOp] {
    static OPS: OnceLock<Vec<NoBackwardOp>> = OnceLock::new();
    OPS.get_or_init(|| {
        CANDIDATES
            .iter()
            .filter(|(_, _, _, op)| !has_backward(*op))
            .map(|(_, name, replacement, _)| NoBackwardOp {
                op: name.to_string(),
                replacement: replacement.to_string(),
            })
            .collect()
    })
}

/// Whether `op` passes a gradient to its input.
fn has_backward(op: fn(&Tensor) -> candle_core::Result<Tensor>) -> bool {
    let run = || -> candle_core::Result<bool> {
        let x = Var::from_tensor(&Tensor::new(
            &[[0.3f32, -1.2, 0.7, 2.0], [1.1, 0.4, -0.6, 0.2]],
            &Device::Cpu,
        )?)?;
        let y = op(x.as_tensor())?;
        let w = Tensor::arange(0f32, y.elem_count() as f32, &Device::Cpu)?
            .reshape(y.shape())?
            .to_dtype(DType::F32)?;
        let grads = (y * w)?.sum_all()?.backward()?;
        Ok(grads.get(x.as_tensor()).is_some())
    };
    // An op that fails to run or to differentiate has no usable backward.
    run().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_ops_of_candle_have_no_backward_and_their_replacements_do() {
        let ops: Vec<&str> = no_backward_ops().iter().map(|o| o.op.as_str()).collect();
        // If candle gives one of these a backward pass, this test says so:
        // the list (and the docs that quote it) should then shrink.
        for name in [
            "softmax_last_dim",
            "ops::layer_norm",
            "ops::rms_norm",
            "rotary_emb::rope",
        ] {
            assert!(
                ops.iter().any(|o| o.contains(name)),
                "{name} now has a backward pass in candle: {ops:?}"
            );
        }
        assert!(has_backward(|x| candle_nn::ops::softmax(
            x,
            candle_core::D::Minus1
        )));
        assert!(has_backward(|x| {
            let w = Tensor::ones(4, DType::F32, &Device::Cpu)?;
            let b = Tensor::zeros(4, DType::F32, &Device::Cpu)?;
            candle_nn::ops::layer_norm_slow(x, &w, &b, 1e-5)
        }));
        assert!(has_backward(|x| {
            let (cos, sin) = rope_tables(x)?;
            candle_nn::rotary_emb::rope_slow(&x.reshape((1, 1, 2, 4))?, &cos, &sin)
        }));
    }

    #[test]
    fn frozen_declarations_match_a_tensor_or_a_module_prefix() {
        let frozen = vec!["embeddings".to_string(), "head.bias".to_string()];
        assert!(declared_frozen("embeddings.word.weight", &frozen));
        assert!(declared_frozen("head.bias", &frozen));
        assert!(!declared_frozen("head.weight", &frozen));
        assert!(!declared_frozen("embeddings_extra.weight", &frozen));
    }
}
