//! Loss functions on (rows × classes) outputs and dense targets.
//!
//! Each loss is written the way it is commonly written, with its eps/clamp
//! knob, so that the unsafe variants fail the way they fail in practice.
//! Reductions follow PyTorch: `mean` over elements for element-wise losses,
//! mean over rows for the distribution losses (`batchmean` for KL).

use crate::kernels;
use crate::models::layers::{sigmoid, softmax};
use crate::spec::LossSpec;
use candle_core::{Result, Tensor, D};

/// The documented stable domain of a loss configuration: `Some(bound)` when
/// the loss and its gradient stay finite in f32 for every logit with
/// |z| ≤ bound and every valid target of the loss's kind; `None` when the
/// configuration is documented as unsafe (an eps below its floor, or a
/// formula that needs positive inputs). The `losses` fuzz target checks
/// this documentation.
///
/// | loss | stable for |
/// |---|---|
/// | cross_entropy, nll, bce_with_logits | \|z\| ≤ 1e36 (stable log-sum-exp / softplus) |
/// | naive_cross_entropy, bce, kl_div, log_one_minus | eps ≥ 1e-6, \|z\| ≤ 1e36 |
/// | mse, huber | \|z\| ≤ 1e18 (the square must not overflow); root mse needs eps ≥ 1e-12 |
/// | poisson_nll | log_input, z ≤ 80 (exp overflows at 88.7); not on raw inputs |
pub fn stable_domain(spec: &LossSpec) -> Option<f64> {
    const EPS_FLOOR: f64 = 1e-6;
    match *spec {
        LossSpec::CrossEntropy { .. } | LossSpec::Nll | LossSpec::BceWithLogits => Some(1e36),
        LossSpec::NaiveCrossEntropy { eps }
        | LossSpec::Bce { eps }
        | LossSpec::KlDiv { eps }
        | LossSpec::LogOneMinus { eps } => (eps >= EPS_FLOOR).then_some(1e36),
        LossSpec::Mse { root, eps } => (!root || eps >= 1e-12).then_some(1e18),
        LossSpec::Huber { .. } => Some(1e18),
        LossSpec::PoissonNll { log_input, .. } => log_input.then_some(80.0),
        // Nothing is known about the caller's loss.
        LossSpec::Custom { .. } => None,
    }
}

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
            kernels::cross_entropy(logits, &t)
        }
        LossSpec::Custom { ref name, .. } => {
            candle_core::bail!("the custom loss `{name}` is computed by the caller's closure")
        }
        LossSpec::NaiveCrossEntropy { eps } => {
            let logp = (softmax(logits)? + eps)?.log()?;
            selected(targets, &logp)?.sum(D::Minus1)?.neg()?.mean_all()
        }
        LossSpec::Nll => kernels::cross_entropy(logits, targets),
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
            // candle's relu and abs both have slope 1 at 0, which together
            // give the exact σ(0) − t there (not the built-in relu's rule).
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
/// A loss of the caller's own (`LossSpec::Custom`): the scalar loss of
/// logits (rows × classes, in the loss dtype) against dense targets of the
/// same shape. Any `Fn(&Tensor, &Tensor) -> candle_core::Result<Tensor>` is one.
pub trait UserLoss: Send + Sync {
    /// The loss of `logits` against `targets`, a scalar.
    fn loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor>;
}

impl<F> UserLoss for F
where
    F: Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync,
{
    fn loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self(logits, targets)
    }
}

/// The loss of a batch (mixup: λ·L(t₁) + (1-λ)·L(t₂)); `user` computes a
/// `custom` loss.
pub fn batch_loss(
    spec: &LossSpec,
    user: Option<&dyn UserLoss>,
    logits: &Tensor,
    targets: &Tensor,
    mix: Option<(f64, &Tensor)>,
) -> Result<Tensor> {
    let one = |t: &Tensor| match (spec, user) {
        (LossSpec::Custom { .. }, Some(user)) => user.loss(logits, t),
        _ => loss(spec, logits, t),
    };
    let l = one(targets)?;
    match mix {
        None => Ok(l),
        Some((lam, t2)) => (l * lam)? + (one(t2)? * (1.0 - lam))?,
    }
}

#[cfg(test)]
mod tests {
    //! Values and gradients on a 2×3 example. Every expected number comes from
    //! `docs/reference/reference_values.py`, which evaluates the textbook
    //! formula (and its closed-form gradient) in plain Python f64.
    use super::*;
    use crate::spec::LossSpec as L;
    use candle_core::{Device, Var};

    const Z: [[f64; 3]; 2] = [[1.0, 2.0, 0.5], [-1.0, 0.0, 3.0]];
    const ONEHOT: [[f64; 3]; 2] = [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
    const VALUES: [[f64; 3]; 2] = [[0.5, -1.0, 2.0], [0.0, 1.0, -0.5]];
    const COUNTS: [[f64; 3]; 2] = [[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]];
    const DIST: [[f64; 3]; 2] = [[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]];
    const BINARY: [[f64; 3]; 2] = [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]];
    /// f64 evaluation of the same formula in another order: a few ulps.
    const STRICT: f64 = 1e-12;

    fn check(spec: LossSpec, z: [[f64; 3]; 2], t: [[f64; 3]; 2], value: f64, grad: [[f64; 3]; 2]) {
        let z = Var::new(&z, &Device::Cpu).unwrap();
        let t = Tensor::new(&t, &Device::Cpu).unwrap();
        let l = loss(&spec, z.as_tensor(), &t).unwrap();
        let got = l.to_scalar::<f64>().unwrap();
        assert!(
            (got - value).abs() <= STRICT * value.abs().max(1.0),
            "{spec:?}: value {got} != {value}"
        );
        let g = l
            .backward()
            .unwrap()
            .get(z.as_tensor())
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        for (gr, er) in g.iter().zip(grad.iter()) {
            for (a, b) in gr.iter().zip(er.iter()) {
                assert!((a - b).abs() <= STRICT, "{spec:?}: grad {g:?} != {grad:?}");
            }
        }
    }

    // softmax(z) - t, over N rows.
    const CE_GRAD: [[f64; 3]; 2] = [
        [
            0.11561194881107453,
            -0.18573414039411879,
            0.07012219158304424,
        ],
        [
            0.008573912772760196,
            0.02330631128898695,
            -0.03188022406174712,
        ],
    ];

    #[test]
    fn cross_entropy_family() {
        // mean_i(logsumexp(z_i) - z_i[y_i])
        let ce = 0.26512634393268697;
        check(
            L::CrossEntropy {
                label_smoothing: 0.0,
            },
            Z,
            ONEHOT,
            ce,
            CE_GRAD,
        );
        check(L::NaiveCrossEntropy { eps: 0.0 }, Z, ONEHOT, ce, CE_GRAD);
        check(L::Nll, Z, ONEHOT, ce, CE_GRAD);
        // Targets (1-ε)·onehot + ε/C with ε = 0.1.
        check(
            L::CrossEntropy {
                label_smoothing: 0.1,
            },
            Z,
            ONEHOT,
            0.4234596772660203,
            [
                [
                    0.09894528214440787,
                    -0.15240080706078546,
                    0.053455524916377575,
                ],
                [
                    -0.00809275389390647,
                    0.006639644622320282,
                    0.001453109271586206,
                ],
            ],
        );
    }

    #[test]
    fn regression_losses() {
        // mean((z - t)²), gradient 2(z - t)/n.
        check(
            L::Mse {
                root: false,
                eps: 0.0,
            },
            Z,
            VALUES,
            4.291666666666667,
            [
                [0.16666666666666666, 1.0, -0.5],
                [-0.3333333333333333, -0.3333333333333333, 1.1666666666666667],
            ],
        );
        // sqrt(mse + 1e-6), gradient mse'/(2·rmse).
        check(
            L::Mse {
                root: true,
                eps: 1e-6,
            },
            Z,
            VALUES,
            2.071634057131391,
            [
                [
                    0.04022589464894475,
                    0.24135536789366852,
                    -0.12067768394683426,
                ],
                [-0.0804517892978895, -0.0804517892978895, 0.2815812625426133],
            ],
        );
        // ½e² for |e| ≤ 1, |e| - ½ otherwise; mean.
        check(
            L::Huber { delta: 1.0 },
            Z,
            VALUES,
            1.2708333333333333,
            [
                [
                    0.08333333333333333,
                    0.16666666666666666,
                    -0.16666666666666666,
                ],
                [
                    -0.16666666666666666,
                    -0.16666666666666666,
                    0.16666666666666666,
                ],
            ],
        );
    }

    #[test]
    fn binary_losses() {
        // -mean(t log σ(z) + (1-t) log(1-σ(z))), gradient (σ(z) - t)/n.
        let bce = 0.7448771503988687;
        let grad = [
            [
                0.12184309643833414,
                -0.01986715367035295,
                0.10374322186697577,
            ],
            [
                -0.12184309643833414,
                0.08333333333333333,
                -0.007904312196261106,
            ],
        ];
        check(L::Bce { eps: 0.0 }, Z, BINARY, bce, grad);
        check(L::BceWithLogits, Z, BINARY, bce, grad);
        // The article's loss: mean(log(1 - σ(z)) · t), gradient -σ(z)·t/n.
        check(
            L::LogOneMinus { eps: 0.0 },
            Z,
            BINARY,
            -0.9147961750224898,
            [
                [0.0, -0.14679951299631372, 0.0],
                [-0.04482357022833252, 0.0, -0.15876235447040557],
            ],
        );
    }

    #[test]
    fn distribution_and_count_losses() {
        // Σ t (log t - log softmax(z)) / N, gradient (softmax(z) - t)/N.
        check(
            L::KlDiv { eps: 0.0 },
            Z,
            DIST,
            0.10578390707531182,
            [
                [
                    0.015611948811074527,
                    0.06426585960588121,
                    -0.07987780841695576,
                ],
                [
                    -0.04142608722723981,
                    -0.026693688711013054,
                    0.06811977593825286,
                ],
            ],
        );
        // mean(exp(z) - t z), gradient (exp(z) - t)/n.
        check(
            L::PoissonNll {
                log_input: true,
                eps: 0.0,
            },
            Z,
            COUNTS,
            4.784912593741489,
            [
                [0.45304697140984085, 0.8981760164884417, 0.1081202117833547],
                [-0.43868675980475963, 0.16666666666666666, 3.180922820531278],
            ],
        );
        // mean(z - t log(z + 1e-8)) at z = |Z| + 0.5, gradient (1 - t/(z + eps))/n.
        check(
            L::PoissonNll {
                log_input: false,
                eps: 1e-8,
            },
            [[1.5, 2.5, 1.0], [1.5, 0.5, 3.5]],
            COUNTS,
            1.033043367095781,
            [
                [
                    0.16666666666666666,
                    0.03333333386666667,
                    1.6666666380338313e-09,
                ],
                [
                    -0.16666666444444447,
                    0.16666666666666666,
                    0.11904761918367346,
                ],
            ],
        );
    }

    fn loss_of(spec: &LossSpec, z: f32, gap: f32) -> f32 {
        // Two classes, target class 0 with logit z - gap, the other z.
        let logits = Tensor::new(&[[z - gap, z]], &Device::Cpu).unwrap();
        let t = Tensor::new(&[[1f32, 0.0]], &Device::Cpu).unwrap();
        loss(spec, &logits, &t).unwrap().to_scalar::<f32>().unwrap()
    }

    #[test]
    fn naive_cross_entropy_is_infinite_where_the_stable_one_is_finite() {
        // A logit gap of 200 makes softmax underflow to 0 in f32 (e^-200 < 1e-45).
        let stable = loss_of(
            &L::CrossEntropy {
                label_smoothing: 0.0,
            },
            0.0,
            200.0,
        );
        let naive = loss_of(&L::NaiveCrossEntropy { eps: 0.0 }, 0.0, 200.0);
        assert!(
            (stable - 200.0).abs() < 1e-3,
            "stable CE is the gap: {stable}"
        );
        assert_eq!(naive, f32::INFINITY);
        // An eps bounds it: -log(1e-7) ≈ 16.1.
        let guarded = loss_of(&L::NaiveCrossEntropy { eps: 1e-7 }, 0.0, 200.0);
        assert!((guarded - 16.118).abs() < 1e-2, "{guarded}");
        // Huge but finite logits: the stable CE shifts by the max.
        assert!(loss_of(
            &L::CrossEntropy {
                label_smoothing: 0.0
            },
            1e30,
            1.0
        )
        .is_finite());
    }

    #[test]
    fn unguarded_losses_fail_where_their_guard_holds() {
        let z = Tensor::new(&[[40f32]], &Device::Cpu).unwrap(); // σ(40) rounds to 1 in f32
        let t = Tensor::new(&[[1f32]], &Device::Cpu).unwrap();
        let value = |spec: LossSpec| loss(&spec, &z, &t).unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(value(L::LogOneMinus { eps: 0.0 }), f32::NEG_INFINITY);
        assert!(value(L::LogOneMinus { eps: 1e-7 }).is_finite());
        let t0 = Tensor::new(&[[0f32]], &Device::Cpu).unwrap();
        let bce = |eps| {
            loss(&L::Bce { eps }, &z, &t0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        assert_eq!(bce(0.0), f32::INFINITY);
        assert!(bce(1e-7).is_finite());
        // Poisson with log_input: exp(100) overflows f32.
        let big = Tensor::new(&[[100f32]], &Device::Cpu).unwrap();
        let p = loss(
            &L::PoissonNll {
                log_input: true,
                eps: 0.0,
            },
            &big,
            &t,
        )
        .unwrap();
        assert_eq!(p.to_scalar::<f32>().unwrap(), f32::INFINITY);
    }
}
