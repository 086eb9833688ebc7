//! The top Hessian eigenvalue of the loss at initialization, by power
//! iteration on finite-difference Hessian-vector products (candle has no
//! double backward): H·w ≈ (∇L(θ + h·w) − ∇L(θ − h·w)) / 2h, in f64.
//!
//! For adaptive optimizers the iteration runs on the preconditioned Hessian
//! D·H·D with D = (√v̂ + eps)^(-1/2), v̂ the mean squared gradient over the
//! first batches at initialization, i.e. what Adam divides by early on.
//! A quadratic model predicts divergence above 2/λ for gradient descent,
//! (2+2β)/λ with heavy-ball momentum β, and (2+2β₁)/((1−β₁)λ) for Adam on
//! the preconditioned Hessian (Cohen et al., "Adaptive gradient methods at
//! the edge of stability").

use crate::error::{Error, Result};
use crate::models::{ModelFactory, Tracer};
use crate::rng::Rng;
use crate::runner::{RunOptions, Session};
use crate::spec::{Case, OptimizerSpec, Precision};
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

/// Power-iteration settings.
#[derive(Clone, Copy, Debug)]
pub struct PowerIteration {
    pub max_iterations: usize,
    /// Stop when the Rayleigh quotient changes by less than this (relative).
    pub rel_tol: f64,
    /// Batches averaged for Adam's v̂.
    pub preconditioner_batches: usize,
}

impl Default for PowerIteration {
    fn default() -> Self {
        PowerIteration {
            max_iterations: 60,
            rel_tol: 1e-4,
            preconditioner_batches: 8,
        }
    }
}

/// The sharpness at initialization and what it predicts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curvature {
    /// Largest positive eigenvalue of the (preconditioned) Hessian.
    pub lambda: f64,
    /// Whether `lambda` is of Adam's preconditioned Hessian.
    pub preconditioned: bool,
    /// The divergence LR a quadratic model predicts (None when the
    /// optimizer has no formula here or the curvature is not positive).
    pub predicted_lr: Option<f64>,
    pub iterations: usize,
    pub gradient_evals: usize,
}

/// The quadratic-model divergence LR of an optimizer at sharpness `lambda`.
pub fn predicted_lr(optimizer: &OptimizerSpec, lambda: f64) -> Option<f64> {
    if lambda.is_nan() || lambda <= 0.0 {
        return None;
    }
    match *optimizer {
        OptimizerSpec::Sgd {
            momentum,
            nesterov: false,
            ..
        } => Some((2.0 + 2.0 * momentum) / lambda),
        OptimizerSpec::Sgd { nesterov: true, .. } => None,
        OptimizerSpec::Adam { beta1, .. } | OptimizerSpec::Adamw { beta1, .. } => {
            Some((2.0 + 2.0 * beta1) / ((1.0 - beta1) * lambda))
        }
        OptimizerSpec::Rmsprop { momentum, .. } => Some((2.0 + 2.0 * momentum) / lambda),
    }
}

/// The rule behind [`predicted_lr`], for reports.
pub fn prediction_rule(optimizer: &OptimizerSpec) -> &'static str {
    match optimizer {
        OptimizerSpec::Sgd {
            nesterov: false, ..
        } => "(2+2·momentum)/λ(H)",
        OptimizerSpec::Sgd { nesterov: true, .. } => "none for Nesterov",
        OptimizerSpec::Adam { .. } | OptimizerSpec::Adamw { .. } => "(2+2β₁)/((1−β₁)·λ(D·H·D))",
        OptimizerSpec::Rmsprop { .. } => "(2+2·momentum)/λ(D·H·D)",
    }
}

fn preconditioner_eps(optimizer: &OptimizerSpec) -> Option<f64> {
    optimizer.eps()
}

/// A point in parameter space: one tensor per trainable variable.
type Point = Vec<Tensor>;

fn dot(a: &Point, b: &Point) -> Result<f64> {
    let mut s = 0.0;
    for (x, y) in a.iter().zip(b) {
        s += (x * y)?.sum_all()?.to_scalar::<f64>()?;
    }
    Ok(s)
}

fn scale(a: &Point, k: f64) -> Result<Point> {
    Ok(a.iter()
        .map(|x| x * k)
        .collect::<candle_core::Result<_>>()?)
}

/// a + k·b
fn axpy(a: &Point, k: f64, b: &Point) -> Result<Point> {
    Ok(a.iter()
        .zip(b)
        .map(|(x, y)| x + (y * k)?)
        .collect::<candle_core::Result<_>>()?)
}

fn mul(a: &Point, b: &Point) -> Result<Point> {
    Ok(a.iter()
        .zip(b)
        .map(|(x, y)| x * y)
        .collect::<candle_core::Result<_>>()?)
}

struct Objective<'s, 'f> {
    session: &'s Session<'f>,
    batches: Vec<crate::data::HostBatch>,
    evals: usize,
}

impl Objective<'_, '_> {
    /// The loss gradient of batch `b` at `theta` (installed in the model).
    fn gradient(&mut self, theta: &Point, b: usize) -> Result<Point> {
        let (names, vars) = self.session.vars();
        for (var, value) in vars.iter().zip(theta) {
            var.set(value)?;
        }
        self.evals += 1;
        let loss = self
            .session
            .forward_loss(&self.batches[b], &mut Tracer::off())?
            .loss;
        let value = loss.to_scalar::<f64>()?;
        if !value.is_finite() {
            return Err(Error::invalid(
                "model",
                format!("the loss at initialization is {value}: no curvature to measure"),
            ));
        }
        let grads = loss.backward()?;
        names
            .iter()
            .zip(vars)
            .map(|(_, v)| match grads.get(v.as_tensor()) {
                Some(g) => Ok(g.clone()),
                None => Ok(v.as_tensor().zeros_like()?),
            })
            .collect()
    }
}

/// The sharpness of a case's loss at initialization (on its first batch),
/// preconditioned as its optimizer would be; the model's parameters are
/// left as they were created.
pub fn sharpness(
    case: &Case,
    factory: &dyn ModelFactory,
    opts: &RunOptions,
    power: &PowerIteration,
) -> Result<Curvature> {
    let mut case = case.clone();
    case.precision = Precision::F64;
    let session = Session::new(&case, factory, opts)?;
    let eps = preconditioner_eps(&case.optimizer);
    let n_batches = if eps.is_some() {
        power.preconditioner_batches.clamp(1, case.steps)
    } else {
        1
    };
    let batches = (0..n_batches)
        .map(|step| {
            session.batch(step)?.map_err(|f| {
                Error::invalid(
                    "data",
                    format!(
                        "batch {step} is not finite ({}), so the curvature cannot be measured",
                        f.detail
                    ),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let theta: Point = session
        .vars()
        .1
        .iter()
        .map(|v| v.as_tensor().copy())
        .collect::<candle_core::Result<_>>()?;
    let mut objective = Objective {
        session: &session,
        batches,
        evals: 0,
    };

    // D = (sqrt(mean g²) + eps)^(-1/2), or the identity for SGD.
    let d: Option<Point> = match eps {
        None => None,
        Some(eps) => {
            let mut sq: Option<Point> = None;
            for b in 0..n_batches {
                let g = objective.gradient(&theta, b)?;
                let g2 = mul(&g, &g)?;
                sq = Some(match sq {
                    None => g2,
                    Some(s) => axpy(&s, 1.0, &g2)?,
                });
            }
            let sq = scale(&sq.expect("at least one batch"), 1.0 / n_batches as f64)?;
            Some(
                sq.iter()
                    .map(|s| (s.sqrt()? + eps)?.powf(-0.5))
                    .collect::<candle_core::Result<_>>()?,
            )
        }
    };
    let theta_norm = dot(&theta, &theta)?.sqrt();
    let step = 1e-5 * theta_norm.max(1.0);

    // A·u = D·H·(D·u), by a central difference along w = D·u.
    let apply = |u: &Point, objective: &mut Objective| -> Result<Point> {
        let w = match &d {
            Some(d) => mul(d, u)?,
            None => u.clone(),
        };
        let w_norm = dot(&w, &w)?.sqrt();
        if w_norm == 0.0 {
            return scale(u, 0.0);
        }
        let h = step / w_norm;
        let plus = objective.gradient(&axpy(&theta, h, &w)?, 0)?;
        let minus = objective.gradient(&axpy(&theta, -h, &w)?, 0)?;
        let hw = scale(&axpy(&plus, -1.0, &minus)?, 0.5 / h)?;
        match &d {
            Some(d) => mul(d, &hw),
            None => Ok(hw),
        }
    };

    let mut rng = Rng::keyed(case.seed, "lrtable.power", 0);
    let mut iterations = 0;
    let mut power_run = |shift: f64, objective: &mut Objective| -> Result<f64> {
        let mut u: Point = theta
            .iter()
            .map(|t| {
                let n = t.elem_count();
                let values: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
                Tensor::from_vec(values, t.shape(), t.device())
            })
            .collect::<candle_core::Result<_>>()?;
        u = scale(&u, 1.0 / dot(&u, &u)?.sqrt())?;
        let mut lambda = f64::NAN;
        for k in 0..power.max_iterations {
            iterations += 1;
            let au = axpy(&apply(&u, objective)?, -shift, &u)?;
            let next = dot(&u, &au)?;
            let norm = dot(&au, &au)?.sqrt();
            let converged = k >= 2 && (next - lambda).abs() <= power.rel_tol * next.abs();
            lambda = next;
            if converged || norm == 0.0 {
                break;
            }
            u = scale(&au, 1.0 / norm)?;
        }
        Ok(lambda)
    };
    // The dominant eigenvalue may be negative (a saddle); then the largest
    // positive one is the dominant one of A − λ₁·I, shifted back.
    let first = power_run(0.0, &mut objective)?;
    let lambda = if first >= 0.0 {
        first
    } else {
        power_run(first, &mut objective)? + first
    };
    for (var, value) in session.vars().1.iter().zip(&theta) {
        var.set(value)?;
    }
    debug_assert!(theta.iter().all(|t| t.dtype() == DType::F64));
    Ok(Curvature {
        lambda,
        preconditioned: d.is_some(),
        predicted_lr: predicted_lr(&case.optimizer, lambda),
        iterations,
        gradient_evals: objective.evals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_follow_the_quadratic_model() {
        let sgd = OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        assert_eq!(predicted_lr(&sgd, 4.0), Some(0.5));
        let heavy = OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 0.0,
        };
        assert!((predicted_lr(&heavy, 3.8).unwrap() - 1.0).abs() < 1e-12);
        let adam = Case::example("cnn").unwrap().optimizer;
        assert!((predicted_lr(&adam, 38.0).unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(predicted_lr(&sgd, 0.0), None);
        assert_eq!(predicted_lr(&sgd, -1.0), None);
    }
}
