//! The arithmetic of a [`Substitute`]: the stable formulation computed on
//! the tensor the stage reads, with candle's autograd, so the repaired
//! op's gradient flows; the naive formulation it replaces, so an
//! explanation substitutes only where the stage is what the pattern says
//! (the naive op of its input reproduces its output); and the constants a
//! developer would pick for the dtype.

use crate::finding::{Axis, Substitute};
use crate::spec::{dtype_max, machine_epsilon};
use candle_core::{DType, Result, Tensor, D};

/// The eps a developer adds to a denominator, under a root or a log: small
/// against the values, and still a normal number of the dtype.
pub fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F16 => 1e-4,
        _ => 1e-8,
    }
}

/// The eps of a standardization (batch and layer norms' default).
pub fn norm_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1e-3,
        _ => 1e-5,
    }
}

/// A finite mask value the dtype holds with room to add scores to it.
pub fn mask_fill(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => -1e4,
        _ => -1e9,
    }
}

/// What an exp's input is clamped below: a tenth under ln(max), so that
/// the exp leaves room for the sums and products after it.
pub fn exp_cap(dtype: DType) -> f64 {
    (0.9 * dtype_max(dtype).ln()).floor()
}

/// The largest value below 1 a gate is clamped to: 1 − the dtype's
/// machine epsilon, so that 1 − gate is not 0.
pub fn below_one(dtype: DType) -> f64 {
    1.0 - machine_epsilon(dtype)
}

/// The tensor the stage reads, moved into its op's domain (the kinds that
/// [`Substitute::moves_input`]); any other kind hands it back.
pub fn moved(s: Substitute, x: &Tensor) -> Result<Tensor> {
    match s {
        Substitute::AddEps { eps } => x + eps,
        Substitute::ClampMin { min } | Substitute::FiniteMask { fill: min } => x.maximum(min),
        Substitute::ClampRange { min, max } => x.clamp(min, max),
        _ => Ok(x.clone()),
    }
}

/// The stage's output recomputed from what it read, `x`, with the repair;
/// `out` is what the stage's own code made of it.
pub fn stable(s: Substitute, x: &Tensor, out: &Tensor) -> Result<Tensor> {
    match s {
        Substitute::LogSoftmax => candle_nn::ops::log_softmax(x, D::Minus1),
        Substitute::NormEps { eps } => normalized(x, eps),
        Substitute::SqrtEps { eps, rectified } => (rectify(x, rectified)? + eps)?.sqrt(),
        Substitute::RootEps { eps, keepdim } => (sum_squares(x, keepdim)? + eps)?.sqrt(),
        Substitute::LogSumExp { keepdim } => {
            let m = x.max_keepdim(D::Minus1)?.detach();
            let lse = (x.broadcast_sub(&m)?.exp()?.sum_keepdim(D::Minus1)?.log()? + &m)?;
            if keepdim {
                Ok(lse)
            } else {
                lse.squeeze(D::Minus1)
            }
        }
        Substitute::ClampedScaledExp { scale, cap } => (x * scale)?.minimum(cap)?.exp(),
        Substitute::Standardize {
            axis,
            unbiased,
            eps,
        } => standardized(x, axis, unbiased, eps),
        Substitute::SoftmaxOfMaskedRows => {
            // The rows the mask left finite keep the stage's own output.
            let finite_rows = out.abs()?.lt(f64::INFINITY)?.to_dtype(DType::F32)?;
            let width = finite_rows.dim(D::Minus1)? as f64;
            let whole = finite_rows
                .sum_keepdim(D::Minus1)?
                .ge(width)?
                .broadcast_as(out.shape())?;
            let soft = candle_nn::ops::softmax_last_dim(x)?;
            whole.where_cond(out, &soft)
        }
        Substitute::ShiftedRatioEps { dim, eps } => shifted_ratio(x, dim, eps),
        Substitute::FactorOfCumprod { dim } => {
            let n = x.dim(dim)?;
            x.narrow(dim, 1, n - 1)
        }
        Substitute::LogSpaceSoftmax { floor } => {
            let log_p = candle_nn::ops::log_softmax(x, D::Minus1)?;
            // The floored value forward; backward, d exp(L)/dL as that
            // value: a log taken of it downstream has log_softmax's gradient.
            let p = log_p.exp()?.maximum(floor)?.detach();
            let zero = (&log_p - log_p.detach())?;
            &p + (zero * &p)?
        }
        Substitute::LogSpaceSigmoid { eps } => {
            let g = candle_nn::ops::sigmoid(x)?.clamp(eps, 1.0 - eps)?.detach();
            let slope = (&g * (1.0 - &g)?)?;
            &g + ((x - x.detach())? * slope)?
        }
        _ => moved(s, x),
    }
}

/// What the pattern says the stage computes from `x`: the formulation the
/// substitute replaces. `None` for the kinds that move the input (the
/// stage's own code stays) and for a mask added inside the stage (what
/// was added is not on record).
pub fn naive(s: Substitute, x: &Tensor) -> Result<Option<Tensor>> {
    let t = match s {
        Substitute::LogSoftmax => candle_nn::ops::softmax(x, D::Minus1)?.log()?,
        Substitute::NormEps { .. } => normalized(x, 0.0)?,
        Substitute::SqrtEps { rectified, .. } => rectify(x, rectified)?.sqrt()?,
        Substitute::RootEps { keepdim, .. } => sum_squares(x, keepdim)?.sqrt()?,
        Substitute::LogSumExp { keepdim } => sum_last(&x.exp()?, keepdim)?.log()?,
        Substitute::ClampedScaledExp { scale, .. } => (x * scale)?.exp()?,
        Substitute::Standardize { axis, unbiased, .. } => standardized(x, axis, unbiased, 0.0)?,
        Substitute::ShiftedRatioEps { dim, .. } => shifted_ratio(x, dim, 0.0)?,
        Substitute::FactorOfCumprod { dim } => shifted_ratio(&cumprod(x, dim)?, dim, 0.0)?,
        Substitute::LogSpaceSoftmax { .. } => candle_nn::ops::softmax(x, D::Minus1)?,
        Substitute::LogSpaceSigmoid { .. } => candle_nn::ops::sigmoid(x)?,
        _ => return Ok(None),
    };
    Ok(Some(t))
}

/// Whether the naive formulation of `s` on `x` is what the stage made:
/// the same shape, the same values where the stage's are finite, and
/// non-finite wherever the stage's are. A substitute with no naive form
/// (one that moves the input, the stage's own code staying; a mask added
/// inside the stage) has nothing to check.
pub fn fits(s: Substitute, x: &Tensor, out: &Tensor) -> Result<bool> {
    let Some(n) = naive(s, x)? else {
        return Ok(true);
    };
    if n.dims() != out.dims() {
        return Ok(false);
    }
    let tol = match out.dtype() {
        DType::F16 | DType::BF16 => 2e-2,
        _ => 1e-4,
    };
    let a = values(&n)?;
    let b = values(out)?;
    Ok(a.iter().zip(&b).all(|(&a, &b)| {
        if b.is_finite() {
            a.is_finite() && (a - b).abs() <= tol * (1.0 + b.abs())
        } else {
            !a.is_finite()
        }
    }))
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.flatten_all()?.to_dtype(DType::F64)?.to_vec1()
}

/// The cumulative product along `dim`, in the dtype, as the naive
/// formulation a model writes it (a running product that underflows).
fn cumprod(x: &Tensor, dim: usize) -> Result<Tensor> {
    let mut parts = vec![x.narrow(dim, 0, 1)?];
    for j in 1..x.dim(dim)? {
        let next = (&parts[j - 1] * x.narrow(dim, j, 1)?)?;
        parts.push(next);
    }
    Tensor::cat(&parts, dim)
}

/// The floor of probabilities recomputed in log space: 2/sqrt(max), so
/// that a loss's 1/p² (the backward pass of t/p) stays finite. Only the
/// forward value is floored; the gradient is log_softmax's exactly.
pub fn log_space_floor(dtype: DType) -> f64 {
    2.0 / dtype_max(dtype).sqrt()
}

fn rectify(x: &Tensor, rectified: bool) -> Result<Tensor> {
    if rectified {
        x.relu()
    } else {
        Ok(x.clone())
    }
}

fn sum_squares(x: &Tensor, keepdim: bool) -> Result<Tensor> {
    sum_last(&x.sqr()?, keepdim)
}

fn sum_last(t: &Tensor, keepdim: bool) -> Result<Tensor> {
    if keepdim {
        t.sum_keepdim(D::Minus1)
    } else {
        t.sum(D::Minus1)
    }
}

/// x / sqrt(sum(x²) + eps) over the last dimension (eps 0: x / ‖x‖).
fn normalized(x: &Tensor, eps: f64) -> Result<Tensor> {
    x.broadcast_div(&(sum_squares(x, true)? + eps)?.sqrt()?)
}

/// x[i+1] / (x[i] + eps) along `dim` (eps 0: the plain ratio).
fn shifted_ratio(x: &Tensor, dim: usize, eps: f64) -> Result<Tensor> {
    let n = x.dim(dim)?;
    x.narrow(dim, 1, n - 1)?
        .broadcast_div(&(x.narrow(dim, 0, n - 1)? + eps)?)
}

/// (x − mean) / sqrt(var + eps) over `axis`; with eps 0, the naive
/// (x − mean) / std.
fn standardized(x: &Tensor, axis: Axis, unbiased: bool, eps: f64) -> Result<Tensor> {
    let dim = match axis {
        Axis::Batch => 0,
        Axis::Row => x.rank().saturating_sub(1),
    };
    let n = x.dim(dim)? as f64;
    let c = x.broadcast_sub(&x.mean_keepdim(dim)?)?;
    let sum = c.sqr()?.sum_keepdim(dim)?;
    let var = if unbiased {
        (sum / (n - 1.0).max(1.0))?
    } else {
        (sum / n)?
    };
    c.broadcast_div(&(var + eps)?.sqrt()?)
}

/// The factor k of a stage that computes exp(k·x), read from its finite
/// outputs: the median of ln(out)/x where x is away from 0.
pub fn exp_scale(x: &Tensor, out: &Tensor) -> Result<Option<f64>> {
    if x.dims() != out.dims() {
        return Ok(None);
    }
    let (a, b) = (values(x)?, values(out)?);
    let mut ks: Vec<f64> = a
        .iter()
        .zip(&b)
        .filter(|&(&x, &y)| x.abs() > 1e-3 && y.is_finite() && y > 0.0)
        .map(|(&x, &y)| y.ln() / x)
        .collect();
    if ks.is_empty() {
        return Ok(None);
    }
    ks.sort_by(f64::total_cmp);
    Ok(Some(ks[ks.len() / 2]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn a_stable_formulation_keeps_the_gradient_flowing_where_the_naive_one_is_nan() {
        let x = Var::new(&[[0f32, 0.0], [3.0, 4.0]], &Device::Cpu).unwrap();
        let s = Substitute::NormEps { eps: 1e-8 };
        let out = naive(s, x.as_tensor()).unwrap().unwrap();
        assert!(fits(s, x.as_tensor(), &out).unwrap());
        let y = stable(s, x.as_tensor(), &out).unwrap();
        let v = y.to_vec2::<f32>().unwrap();
        assert_eq!(v[0], [0.0, 0.0]);
        assert!((v[1][0] - 0.6).abs() < 1e-6);
        let g = (y * 2.0).unwrap().sum_all().unwrap().backward().unwrap();
        let gx = g.get(x.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert!(gx.iter().flatten().all(|v| v.is_finite()), "{gx:?}");
        assert!(gx[0][0] > 0.0, "the zero row still learns: {gx:?}");
        // The naive op of another input is not what the stage made.
        let other = Tensor::new(&[[1f32, 0.0], [3.0, 4.0]], &Device::Cpu).unwrap();
        assert!(!fits(s, &other, &out).unwrap());
    }

    #[test]
    fn the_scale_of_an_exp_is_read_from_its_outputs() {
        let x = Tensor::new(&[[2.0f32, 0.5, -1.0]], &Device::Cpu).unwrap();
        let out = (&x * 50.0).unwrap().exp().unwrap();
        let k = exp_scale(&x, &out).unwrap().unwrap();
        assert!((k - 50.0).abs() < 1e-3, "{k}");
        let s = Substitute::ClampedScaledExp {
            scale: k,
            cap: exp_cap(DType::F32),
        };
        assert!(fits(s, &x, &out).unwrap());
        let y = stable(s, &x, &out).unwrap().to_vec2::<f32>().unwrap();
        assert!(y[0].iter().all(|v| v.is_finite()), "{y:?}");
        assert_eq!(exp_cap(DType::F32), 79.0);
    }
}
