//! Loss functions on (rows × classes) outputs and dense targets.
//!
//! Each loss is written the way it is commonly written, with its eps/clamp
//! knob, so that the unsafe variants fail the way they fail in practice.
//! Reductions follow PyTorch: `mean` over elements for element-wise losses,
//! mean over rows for the distribution losses (`batchmean` for KL).

use crate::models::layers::{log_softmax, sigmoid, softmax};
use crate::spec::LossSpec;
use candle_core::{Result, Tensor, D};

/// The loss of `logits` against `targets` (both rows × classes, same dtype).
pub fn loss(spec: &LossSpec, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let classes = logits.dim(D::Minus1)? as f64;
    match *spec {
        LossSpec::CrossEntropy { label_smoothing } => {
            let t = if label_smoothing > 0.0 {
                targets.affine(1.0 - label_smoothing, label_smoothing / classes)?
            } else {
                targets.clone()
            };
            (t * log_softmax(logits)?)?
                .sum(D::Minus1)?
                .neg()?
                .mean_all()
        }
        LossSpec::NaiveCrossEntropy { eps } => {
            let logp = (softmax(logits)? + eps)?.log()?;
            selected(targets, &logp)?.sum(D::Minus1)?.neg()?.mean_all()
        }
        LossSpec::Nll => (targets * log_softmax(logits)?)?
            .sum(D::Minus1)?
            .neg()?
            .mean_all(),
        LossSpec::Mse { root, eps } => {
            let mse = (logits - targets)?.sqr()?.mean_all()?;
            if root {
                (mse + eps)?.sqrt()
            } else {
                Ok(mse)
            }
        }
        LossSpec::Huber { delta } => {
            let d = (logits - targets)?.abs()?;
            let quadratic = (d.sqr()? * 0.5)?;
            let linear = ((&d - 0.5 * delta)? * delta)?;
            d.le(delta)?.where_cond(&quadratic, &linear)?.mean_all()
        }
        LossSpec::Bce { eps } => {
            let p = sigmoid(logits)?.clamp(eps, 1.0 - eps)?;
            let one_minus_t = targets.affine(-1.0, 1.0)?;
            let one_minus_p = p.affine(-1.0, 1.0)?;
            ((targets * p.log()?)? + (one_minus_t * one_minus_p.log()?)?)?
                .mean_all()?
                .neg()
        }
        LossSpec::BceWithLogits => {
            let softplus_neg_abs = (logits.abs()?.neg()?.exp()? + 1.0)?.log()?;
            ((logits.relu()? - (logits * targets)?)? + softplus_neg_abs)?.mean_all()
        }
        LossSpec::KlDiv { eps } => {
            let p = softmax(logits)?.clamp(eps, 1.0 - eps)?;
            let t_log_t = selected(targets, &targets.log()?)?;
            (t_log_t - (targets * p.log()?)?)?
                .sum(D::Minus1)?
                .mean_all()
        }
        LossSpec::PoissonNll { log_input, eps } => {
            if log_input {
                (logits.exp()? - (targets * logits)?)?.mean_all()
            } else {
                (logits - (targets * (logits + eps)?.log()?)?)?.mean_all()
            }
        }
        LossSpec::LogOneMinus { eps } => {
            let p = sigmoid(logits)?.clamp(eps, 1.0 - eps)?;
            (p.affine(-1.0, 1.0)?.log()? * targets)?.mean_all()
        }
    }
}

/// `t · x` where t > 0 and 0 elsewhere: a gather of the target entries, so
/// that 0 · (-inf) from non-target classes does not turn the loss into NaN.
fn selected(targets: &Tensor, x: &Tensor) -> Result<Tensor> {
    let zeros = targets.zeros_like()?;
    targets.gt(0.0)?.where_cond(&(targets * x)?, &zeros)
}

/// The loss of a batch, mixing two target sets with λ under mixup.
pub fn batch_loss(
    spec: &LossSpec,
    logits: &Tensor,
    targets: &Tensor,
    mix: Option<(f64, &Tensor)>,
) -> Result<Tensor> {
    let l = loss(spec, logits, targets)?;
    match mix {
        None => Ok(l),
        Some((lam, t2)) => (l * lam)? + (loss(spec, logits, t2)? * (1.0 - lam))?,
    }
}
