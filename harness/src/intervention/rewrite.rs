//! The arithmetic of a [`crate::finding::Rewrite`]: the op's output recomputed from the
//! tensors it read (and, for a form that reads another op's operands,
//! from those) with the stable form in place — candle ops with their
//! gradients, so training runs through the rewrite as it would through
//! the edited line.

use crate::finding::RewriteForm;
use crate::instrument::Operand;
use candle_core::{bail, Result, Tensor, D};

/// The output of op `op` (its method, function or operator) rewritten by
/// `form`; `inputs` are what it read, `from` the first tensor the `from`
/// op read, `out` what the code made (its shape and dtype are kept).
pub fn rewritten(
    form: RewriteForm,
    op: &str,
    inputs: &[Operand],
    from: Option<&Tensor>,
    out: &Tensor,
) -> Result<Tensor> {
    let tensors: Vec<&Tensor> = Operand::tensors(inputs).collect();
    let scalar = Operand::scalars(inputs).next();
    let Some(&x) = tensors.first() else {
        bail!("the rewrite of `{op}` found no tensor operand");
    };
    // What the op at `from` read: it runs before the rewritten op.
    let read = || match from {
        Some(z) => Ok(z),
        None => Err(candle_core::Error::Msg(format!(
            "the rewrite of `{op}` reads an op (a softmax, an exp) that did not run before it"
        ))),
    };
    let y = match form {
        RewriteForm::LogSoftmax => candle_nn::ops::log_softmax(read()?, D::Minus1)?,
        RewriteForm::OperandPlusEps { eps } => unary(op, &(x + eps)?, scalar)?,
        RewriteForm::OperandFloor { floor } => unary(op, &x.maximum(floor)?, scalar)?,
        RewriteForm::DenominatorFloor { floor } => match (op, tensors.as_slice()) {
            ("recip", _) => x.maximum(floor)?.recip()?,
            (_, [a, b]) => a.broadcast_div(&b.maximum(floor)?)?,
            _ => bail!("the rewrite of `{op}` needs a numerator and a denominator"),
        },
        RewriteForm::MaxSubtracted => x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?.exp()?,
        RewriteForm::ClampBeforeCast { limit } => x.clamp(-limit, limit)?.to_dtype(out.dtype())?,
        RewriteForm::Softplus => softplus(read()?)?,
        RewriteForm::NegSoftplus => softplus(read()?)?.neg()?,
        RewriteForm::LogSumExp { keepdim_at } => {
            let lse = read()?.log_sum_exp(D::Minus1)?;
            match keepdim_at {
                Some(k) => lse.unsqueeze(k)?,
                None => lse,
            }
        }
        RewriteForm::ClampedExp { cap } => x.minimum(cap)?.exp()?,
        RewriteForm::FiniteOperands { limit } => match (op, tensors.as_slice()) {
            ("-" | "broadcast_sub", [a, b]) => a
                .clamp(-limit, limit)?
                .broadcast_sub(&b.clamp(-limit, limit)?)?,
            ("+" | "broadcast_add", [a, b]) => a
                .clamp(-limit, limit)?
                .broadcast_add(&b.clamp(-limit, limit)?)?,
            _ => bail!("no rewrite of `{op}` with its operands clamped"),
        },
        RewriteForm::Widened { .. } => {
            bail!("an op of a region computed in f32 is computed by `widen::apply`")
        }
        RewriteForm::BiasedVariance { dim, keepdim } => {
            let v = x.broadcast_sub(&x.mean_keepdim(dim)?)?.sqr()?;
            match keepdim {
                true => v.mean_keepdim(dim)?,
                false => v.mean(dim)?,
            }
        }
    };
    if y.dims() != out.dims() {
        bail!(
            "the rewrite of `{op}` has shape {:?}, the op {:?}",
            y.dims(),
            out.dims()
        );
    }
    Ok(y)
}

/// The unary op `op` of `x` (a power's exponent is `scalar`).
fn unary(op: &str, x: &Tensor, scalar: Option<f64>) -> Result<Tensor> {
    match (op, scalar) {
        ("log", _) => x.log(),
        ("sqrt", _) => x.sqrt(),
        ("powf", Some(e)) => x.powf(e),
        _ => bail!("no rewrite of `{op}` with its input moved"),
    }
}

/// log(1 + exp(−|z|)) + relu(z): the softplus that cannot overflow.
fn softplus(z: &Tensor) -> Result<Tensor> {
    (z.abs()?.neg()?.exp()? + 1.0)?.log()? + z.relu()?
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn a_rewritten_op_is_finite_and_its_gradient_flows() {
        // log(softmax(z)) with logits 200 apart: −inf; log_softmax(z) is
        // finite, with the gradient of a loss on the logits.
        let z = Var::new(&[[200f32, 0.0]], &Device::Cpu).unwrap();
        let p = candle_nn::ops::softmax_last_dim(z.as_tensor()).unwrap();
        let out = p.log().unwrap();
        let y = rewritten(
            RewriteForm::LogSoftmax,
            "log",
            &[Operand::Tensor(p)],
            Some(z.as_tensor()),
            &out,
        )
        .unwrap();
        assert_eq!(y.to_vec2::<f32>().unwrap()[0], [0.0, -200.0]);
        let g = y.sum_all().unwrap().backward().unwrap();
        assert_eq!(
            g.get(z.as_tensor()).unwrap().to_vec2::<f32>().unwrap()[0],
            [-1.0, 1.0]
        );
        // A root at 0 with an eps inside: a finite slope.
        let x = Var::new(&[0f32, 4.0], &Device::Cpu).unwrap();
        let out = x.as_tensor().powf(0.5).unwrap();
        let inputs = [Operand::Tensor(x.as_tensor().clone()), Operand::Scalar(0.5)];
        let form = RewriteForm::OperandPlusEps { eps: 1e-5 };
        let y = rewritten(form, "powf", &inputs, None, &out).unwrap();
        let g = y.sum_all().unwrap().backward().unwrap();
        let gx = g.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert!(gx.iter().all(|v| v.is_finite() && *v > 0.0), "{gx:?}");
    }
}
