//! The planted suites (`repairs`, `code_bugs`) written with
//! `#[nanhunt::instrument]` and nothing declared: every bug named at its
//! op and line (forward and backward) and explained; the developer's fix
//! of each trains stably from the same weights.

use super::*;
use candle_core::{DType, Module, D};
use nanhunt::explain::Pattern as P;

const FILE: &str = "tests/integration/op_sight/planted.rs";

#[nanhunt::instrument]
fn relu1(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    n.fc1.forward(x)?.relu()
}

// 1. log(softmax(z)) on sharp logits, the log a statement of its own.
#[nanhunt::instrument]
fn log_of_softmax(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = relu1(n, x)?;
    let z = (n.fc2.forward(&h)? * 60.0)?;
    let p = candle_nn::ops::softmax(&z, D::Minus1)?;
    p.log() // BUG: log_of_softmax
}

#[nanhunt::instrument]
fn log_softmax_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = relu1(n, x)?;
    let z = (n.fc2.forward(&h)? * 60.0)?;
    candle_nn::ops::log_softmax(&z, D::Minus1)
}

// 2. log(softmax(z)) in one statement.
#[nanhunt::instrument]
fn log_softmax_inside(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = relu1(n, x)?;
    let z = (n.fc2.forward(&h)? * 60.0)?;
    candle_nn::ops::softmax(&z, D::Minus1)?.log() // BUG: log_softmax_inside
}

// 3. h / ‖h‖ without an eps, after a ReLU of a layer without bias.
#[nanhunt::instrument]
fn row_norm(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = relu1(n, x)?;
    let norm = h.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
    let h = h.broadcast_div(&norm)?; // BUG: row_norm
    n.fc2.forward(&h)
}

#[nanhunt::instrument]
fn row_norm_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = relu1(n, x)?;
    let norm = (h.sqr()?.sum_keepdim(D::Minus1)? + 1e-8)?.sqrt()?;
    n.fc2.forward(&h.broadcast_div(&norm)?)
}

// 4. sqrt(relu(h)): an infinite slope at 0 in the backward pass.
#[nanhunt::instrument]
fn sqrt_relu(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = n.fc1.forward(x)?;
    let s = h.relu()?.sqrt()?; // BUG: sqrt_relu
    n.fc2.forward(&s)
}

#[nanhunt::instrument]
fn sqrt_relu_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = n.fc1.forward(x)?;
    let s = (h.relu()? + 1e-8)?.sqrt()?;
    n.fc2.forward(&s)
}

// 5. A hand-written sigmoid, 1/(1 + exp(-h)): its exp overflows.
#[nanhunt::instrument]
fn hand_sigmoid(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = n.fc1.forward(x)?;
    let gate = (h.neg()?.exp()? + 1.0)?.recip()?; // BUG: hand_sigmoid
    n.fc2.forward(&gate)
}

#[nanhunt::instrument]
fn hand_sigmoid_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = n.fc1.forward(x)?;
    n.fc2.forward(&candle_nn::ops::sigmoid(&h)?)
}

// 6. exp(50·z) normalized by hand: a softmax without the max subtracted.
#[nanhunt::instrument]
fn scaled_exp(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let z = n.fc1.forward(x)?;
    let act = (z * 50.0)?.exp()?; // BUG: scaled_exp
    let w = act.broadcast_div(&act.sum_keepdim(D::Minus1)?)?;
    n.fc2.forward(&w)
}

#[nanhunt::instrument]
fn scaled_exp_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let z = n.fc1.forward(x)?;
    n.fc2
        .forward(&candle_nn::ops::softmax(&(z * 50.0)?, D::Minus1)?)
}

/// Self-attention over fc1's output as 4 positions of 4: scores and the
/// off-by-one causal mask (j >= i masked: position 0 sees nothing).
#[nanhunt::instrument]
fn scores_and_mask(
    n: &Net,
    x: &Tensor,
    fill: f32,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let q = n.fc1.forward(x)?.reshape(((), 4, 4))?;
    let scores = (q.matmul(&q.t()?)? / 2.0)?;
    let mask: Vec<f32> = (0..4)
        .flat_map(|i| (0..4).map(move |j| if j >= i { fill } else { 0.0 }))
        .collect();
    let mask = Tensor::from_vec(mask, (4, 4), x.device())?.broadcast_as(scores.shape())?;
    Ok((q, scores, mask))
}

#[nanhunt::instrument]
fn attend(n: &Net, q: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    let ctx = w.matmul(q)?.mean(1)?;
    n.fc2.forward(&ctx)
}

// 7. The off-by-one mask filled into the scores with -inf.
#[nanhunt::instrument]
fn filled(n: &Net, x: &Tensor, fill: f32) -> candle_core::Result<Tensor> {
    let (q, scores, mask) = scores_and_mask(n, x, fill)?;
    let masked = mask.ne(0.0)?.where_cond(&mask, &scores)?;
    let w = candle_nn::ops::softmax(&masked, D::Minus1)?; // BUG: masked_fill
    attend(n, &q, &w)
}

fn masked_fill(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    filled(n, x, f32::NEG_INFINITY)
}

fn masked_fill_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    filled(n, x, -1e9)
}

// 8. The same mask added inside the softmax's statement.
#[nanhunt::instrument]
fn added(n: &Net, x: &Tensor, fill: f32) -> candle_core::Result<Tensor> {
    let (q, scores, mask) = scores_and_mask(n, x, fill)?;
    let w = candle_nn::ops::softmax(&(scores + mask)?, D::Minus1)?; // BUG: mask_inside
    attend(n, &q, &w)
}

fn mask_inside(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    added(n, x, f32::NEG_INFINITY)
}

fn mask_inside_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    added(n, x, -1e9)
}

// 9. The log of a linear output as a Poisson rate: negative rates.
#[nanhunt::instrument]
fn log_rate(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = relu1(n, x)?;
    let rate = n.fc2.forward(&h)?;
    rate.log() // BUG: log_rate
}

#[nanhunt::instrument]
fn log_rate_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = relu1(n, x)?;
    n.fc2.forward(&h)?.maximum(1e-8)?.log()
}

/// relu(fc1(x)) with unit 0 dead (its output forced to exactly 0).
#[nanhunt::instrument]
fn dead_unit(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = n.fc1.forward(x)?.relu()?;
    let keep: Vec<f32> = (0..h.dim(1)?).map(|j| f32::from(j != 0)).collect();
    h.broadcast_mul(&Tensor::new(keep, x.device())?)
}

// 10. A batch norm by hand without eps over a dead unit's constant column.
#[nanhunt::instrument]
fn hand_bn(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = dead_unit(n, x)?;
    let c = h.broadcast_sub(&h.mean_keepdim(0)?)?;
    let std = c.sqr()?.mean_keepdim(0)?.sqrt()?;
    n.fc2.forward(&c.broadcast_div(&std)?) // BUG: hand_bn
}

#[nanhunt::instrument]
fn hand_bn_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = dead_unit(n, x)?;
    let c = h.broadcast_sub(&h.mean_keepdim(0)?)?;
    let var = c.sqr()?.mean_keepdim(0)?;
    n.fc2.forward(&c.broadcast_div(&(var + 1e-5)?.sqrt()?)?)
}

// 11. A survival curve as a cumulative product of sharp gates, and its
// hazard as the ratio of the curve to itself shifted by one.
#[nanhunt::instrument]
fn survival(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let g = candle_nn::ops::sigmoid(&(n.fc1.forward(x)? * 20.0)?)?;
    let mut s = vec![g.narrow(1, 0, 1)?];
    for j in 1..g.dim(1)? {
        let next = (&s[j - 1] * g.narrow(1, j, 1)?)?;
        s.push(next);
    }
    let s = Tensor::cat(&s, 1)?;
    let k = s.dim(1)?;
    let hazard = s
        .narrow(1, 1, k - 1)?
        .broadcast_div(&s.narrow(1, 0, k - 1)?)?; // BUG: survival
    n.fc2.forward(&hazard)
}

#[nanhunt::instrument]
fn survival_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let g = candle_nn::ops::sigmoid(&(n.fc1.forward(x)? * 20.0)?)?;
    let k = g.dim(1)?;
    n.fc2.forward(&g.narrow(1, 1, k - 1)?)
}

// 12. The modulus of pairs, sqrt(a² + b²), at the origin.
#[nanhunt::instrument]
fn modulus(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let pairs = relu1(n, x)?.reshape(((), 8, 2))?;
    let m = pairs.sqr()?.sum(D::Minus1)?.sqrt()?; // BUG: modulus
    n.fc2.forward(&m)
}

#[nanhunt::instrument]
fn modulus_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let pairs = relu1(n, x)?.reshape(((), 8, 2))?;
    n.fc2
        .forward(&(pairs.sqr()?.sum(D::Minus1)? + 1e-8)?.sqrt()?)
}

// 16. A logsumexp pooling written as log(sum(exp(h))).
#[nanhunt::instrument]
fn lse_pool(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = n.fc1.forward(x)?;
    let pooled = h.exp()?.sum_keepdim(D::Minus1)?.log()?; // BUG: lse_pool
    n.fc2.forward(&pooled)
}

#[nanhunt::instrument]
fn lse_pool_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = n.fc1.forward(x)?;
    let m = h.max_keepdim(D::Minus1)?;
    let lse = (h.broadcast_sub(&m)?.exp()?.sum_keepdim(D::Minus1)?.log()? + m)?;
    n.fc2.forward(&lse)
}

// 17. Two copies of one block, each normalizing its rows without an eps:
// the first copy's division is named (its ops are numbered, not lined).
#[nanhunt::instrument]
fn normalized(h: &Tensor) -> candle_core::Result<Tensor> {
    let norm = h.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
    h.broadcast_div(&norm) // BUG: blocks
}

#[nanhunt::instrument]
fn blocks(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = normalized(&relu1(n, x)?)?;
    let h = normalized(&(h * 2.0)?.relu()?)?;
    n.fc2.forward(&h)
}

#[nanhunt::instrument]
fn blocks_fixed(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let eps = |h: Tensor| -> candle_core::Result<Tensor> {
        let norm = (h.sqr()?.sum_keepdim(D::Minus1)? + 1e-8)?.sqrt()?;
        h.broadcast_div(&norm)
    };
    let h = eps(relu1(n, x)?)?;
    let h = eps((h * 2.0)?.relu()?)?;
    n.fc2.forward(&h)
}

/// Sharp logits: a softmax of them underflows to exact zeros in f32.
#[nanhunt::instrument]
fn sharp(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = relu1(n, x)?;
    n.fc2.forward(&h)? * 60.0
}

// 13. A cross-entropy by hand, -(t · log(softmax(z))): 0 · log(0) = NaN.
#[nanhunt::instrument]
fn xent(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let p = candle_nn::ops::softmax(z, D::Minus1)?;
    let terms = (t * p.log()?)?; // BUG: xent
    terms.sum(D::Minus1)?.neg()?.mean_all()
}

#[nanhunt::instrument]
fn xent_fixed(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let terms = (t * candle_nn::ops::log_softmax(z, D::Minus1)?)?;
    terms.sum(D::Minus1)?.neg()?.mean_all()
}

// 14. A binary cross-entropy by hand on sigmoid gates that saturate to 1.
#[nanhunt::instrument]
fn bce(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let g = candle_nn::ops::sigmoid(z)?;
    let one_minus = (1.0 - &g)?;
    let terms = ((t * g.log()?)? + ((1.0 - t)? * one_minus.log()?)?)?.neg()?; // BUG: bce
    terms.mean_all()
}

#[nanhunt::instrument]
fn bce_fixed(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let softplus = (z.abs()?.neg()?.exp()? + 1.0)?.log()?;
    ((z.relu()? - (z * t)?)? + softplus)?.mean_all()
}

// 15. A KL divergence with eps 0 against smoothed targets.
#[nanhunt::instrument]
fn kl(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let p = candle_nn::ops::softmax(z, D::Minus1)?;
    let t = ((t * 0.9)? + 0.025)?;
    let terms = (&t * (t.broadcast_div(&p)?).log()?)?; // BUG: kl
    terms.sum(D::Minus1)?.mean_all()
}

#[nanhunt::instrument]
fn kl_fixed(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let logp = candle_nn::ops::log_softmax(z, D::Minus1)?;
    let t = ((t * 0.9)? + 0.025)?;
    (&t * (t.log()? - logp)?)?.sum(D::Minus1)?.mean_all()
}

/// q·kᵀ without 1/sqrt(d) in f16, on inputs of ~60: the sum leaves f16.
struct UnscaledAttention {
    q: Linear,
    k: Linear,
    head: Linear,
}

impl Model for UnscaledAttention {
    #[nanhunt::instrument]
    fn forward(&self, x: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
        let q = self.q.forward(x)?;
        let k = self.k.forward(x)?;
        let scores = q.matmul(&k.t()?)?; // BUG: f16_attention
        let w = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let ctx = w.matmul(x)?.mean(1)?;
        self.head.forward(&ctx)
    }
}

/// Self-attention over embedded tokens with an off-by-one causal mask
/// (j >= i), the fill a -inf tensor picked by `where_cond`.
struct OffByOneMask {
    embed: candle_nn::Embedding,
    q: Linear,
    k: Linear,
    head: Linear,
}

impl Model for OffByOneMask {
    #[nanhunt::instrument]
    fn forward(&self, x: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
        let e = self.embed.forward(x)?;
        let q = self.q.forward(&e)?;
        let k = self.k.forward(&e)?;
        let d = q.dim(D::Minus1)?;
        let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
        let t = scores.dim(1)?;
        let mask: Vec<u8> = (0..t)
            .flat_map(|i| (0..t).map(move |j| u8::from(j >= i)))
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), x.device())?.broadcast_as(scores.shape())?;
        let neg = Tensor::full(f32::NEG_INFINITY, scores.shape(), x.device())?
            .to_dtype(scores.dtype())?;
        let masked = mask.where_cond(&neg, &scores)?;
        let w = candle_nn::ops::softmax(&masked, D::Minus1)?; // BUG: token_mask
        let ctx = w.matmul(&e)?.mean(1)?;
        self.head.forward(&ctx)
    }
}

/// One planted bug, its fix, its case and what its finding must name.
struct Bug {
    case: Case,
    shape: Shape,
    bug: Fwd,
    fixed: Fwd,
    losses: Option<(Arc<dyn UserLoss>, Arc<dyn UserLoss>)>,
    want: Expect,
}

fn expect(
    phase: Phase,
    kind: OpKind,
    marker: &'static str,
    pattern: P,
    quote: &'static str,
) -> Expect {
    Expect {
        phase,
        kind,
        marker,
        pattern,
        quote,
    }
}

fn losses(bug: LossFn, fixed: LossFn) -> Option<(Arc<dyn UserLoss>, Arc<dyn UserLoss>)> {
    Some((Arc::new(bug), Arc::new(fixed)))
}

fn suite() -> Vec<Bug> {
    use OpKind as K;
    use Phase::{Backward as B, Forward as F};
    let bias_free = Shape { bias: false, ..MLP };
    let bug = |case, shape, bug, fixed, want| Bug {
        case,
        shape,
        bug,
        fixed,
        losses: None,
        want,
    };
    let loss_bug = |name: &str, bug: LossFn, fixed: LossFn, targets, want| Bug {
        losses: losses(bug, fixed),
        ..Bug {
            case: custom_loss(vector(name), name, targets),
            shape: MLP,
            bug: sharp,
            fixed: sharp,
            losses: None,
            want,
        }
    };
    vec![
        bug(
            vector("log_of_softmax"),
            MLP,
            log_of_softmax,
            log_softmax_fixed,
            expect(
                F,
                K::Log,
                "log_of_softmax",
                P::LogOfUnderflowedSoftmax,
                "is a softmax that underflowed",
            ),
        ),
        bug(
            vector("log_softmax_inside"),
            MLP,
            log_softmax_inside,
            log_softmax_fixed,
            expect(
                F,
                K::Log,
                "log_softmax_inside",
                P::LogOfUnderflowedSoftmax,
                "span more than 103.3",
            ),
        ),
        bug(
            all_zero(vector("row_norm")),
            bias_free,
            row_norm,
            row_norm_fixed,
            expect(F, K::Div, "row_norm", P::ZeroNormRow, "is a ReLU"),
        ),
        bug(
            vector("sqrt_relu"),
            MLP,
            sqrt_relu,
            sqrt_relu_fixed,
            expect(
                B,
                K::Sqrt,
                "sqrt_relu",
                P::InfiniteSlopeAtZero,
                "is a ReLU, 0 wherever",
            ),
        ),
        bug(
            scaled(vector("hand_sigmoid"), 30.0),
            MLP,
            hand_sigmoid,
            hand_sigmoid_fixed,
            expect(
                F,
                K::Exp,
                "hand_sigmoid",
                P::ExpOverflow,
                "a sigmoid by hand",
            ),
        ),
        bug(
            vector("scaled_exp"),
            MLP,
            scaled_exp,
            scaled_exp_fixed,
            expect(F, K::Exp, "scaled_exp", P::ExpOfScaledInput, "by 50"),
        ),
        bug(
            vector("masked_fill"),
            Shape { head_in: 4, ..MLP },
            masked_fill,
            masked_fill_fixed,
            expect(
                F,
                K::Softmax,
                "masked_fill",
                P::MaskedRow,
                "fills every position",
            ),
        ),
        bug(
            vector("mask_inside"),
            Shape { head_in: 4, ..MLP },
            mask_inside,
            mask_inside_fixed,
            expect(
                F,
                K::Softmax,
                "mask_inside",
                P::MaskInsideSoftmax,
                "adds a mask",
            ),
        ),
        bug(
            all_zero(vector("blocks")),
            bias_free,
            blocks,
            blocks_fixed,
            expect(F, K::Div, "blocks", P::ZeroNormRow, "is a ReLU"),
        ),
        bug(
            vector("log_rate"),
            MLP,
            log_rate,
            log_rate_fixed,
            expect(
                F,
                K::Log,
                "log_rate",
                P::NegativeDomain,
                "that are negative",
            ),
        ),
        bug(
            vector("hand_bn"),
            MLP,
            hand_bn,
            hand_bn_fixed,
            expect(F, K::Div, "hand_bn", P::ConstantNormalized, "column 0 of"),
        ),
        bug(
            vector("survival"),
            Shape { head_in: 15, ..MLP },
            survival,
            survival_fixed,
            expect(F, K::Div, "survival", P::ShiftedRatio, "shifted by one"),
        ),
        bug(
            all_zero(vector("modulus")),
            Shape {
                head_in: 8,
                ..bias_free
            },
            modulus,
            modulus_fixed,
            expect(B, K::Sqrt, "modulus", P::RootOfReducedZero, "are all zeros"),
        ),
        bug(
            scaled(vector("lse_pool"), 30.0),
            Shape { head_in: 1, ..MLP },
            lse_pool,
            lse_pool_fixed,
            expect(
                F,
                K::Exp,
                "lse_pool",
                P::LogOfOverflowedExp,
                "a logsumexp without its max",
            ),
        ),
        loss_bug(
            "xent",
            xent,
            xent_fixed,
            TargetKind::Labels,
            expect(
                F,
                K::Log,
                "xent",
                P::ZeroTimesLogOfZero,
                "multiplies that −inf by 0",
            ),
        ),
        loss_bug(
            "bce",
            bce,
            bce_fixed,
            TargetKind::Labels,
            expect(
                F,
                K::Log,
                "bce",
                P::SaturatedGate,
                "is a sigmoid, which rounds to exactly 0",
            ),
        ),
        loss_bug(
            "kl",
            kl,
            kl_fixed,
            TargetKind::Labels,
            expect(
                F,
                K::Div,
                "kl",
                P::DivisionByZero,
                "is a softmax that underflowed",
            ),
        ),
    ]
}

/// What is wrong with one planted bug, or `None`.
fn check(b: &Bug) -> Option<String> {
    let (bug_loss, fixed_loss) = match &b.losses {
        Some((bug, fixed)) => (Some(bug), Some(fixed)),
        None => (None, None),
    };
    if let Some(e) = stable(&b.case, &net(b.shape, b.fixed), &opts(fixed_loss)) {
        return Some(e);
    }
    fires_as(
        &b.case,
        &net(b.shape, b.bug),
        &opts(bug_loss),
        &b.want,
        FILE,
    )
}

#[test]
fn every_planted_bug_is_named_at_its_op_and_line_and_explained_with_nothing_declared() {
    let bugs = suite();
    let failures: Vec<String> = bugs.iter().filter_map(check).collect();
    all_hold("planted bugs", bugs.len(), failures);
}

#[test]
fn attention_bugs_are_named_at_the_matmul_in_f16_and_the_softmax_of_a_token_mask() {
    let mut failures = Vec::new();
    let mut f16 = vector("f16_attention");
    f16.model = ModelSpec::Custom(CustomSpec::new(
        "f16_attention",
        InputSpec::Sequence {
            seq_len: 6,
            features: 32,
        },
        4,
    ));
    f16.precision = Precision::F16;
    f16.data.scale = 60.0;
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(UnscaledAttention {
            q: linear(32, 32, vb.pp("q"))?,
            k: linear(32, 32, vb.pp("k"))?,
            head: linear(32, 4, vb.pp("head"))?,
        }))
    };
    let want = expect(
        Phase::Forward,
        OpKind::Matmul,
        "f16_attention",
        P::AccumulationOverflow,
        "past f16's largest value",
    );
    failures.extend(fires_as(
        &f16,
        &factory,
        &RunOptions::default(),
        &want,
        FILE,
    ));
    let mut tokens = vector("masked_attention");
    tokens.model = ModelSpec::Custom(CustomSpec::new(
        "masked_attention",
        InputSpec::Tokens {
            seq_len: 6,
            vocab: 16,
        },
        4,
    ));
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(OffByOneMask {
            embed: candle_nn::embedding(16, 8, vb.pp("embed"))?,
            q: linear(8, 8, vb.pp("q"))?,
            k: linear(8, 8, vb.pp("k"))?,
            head: linear(8, 4, vb.pp("head"))?,
        }))
    };
    let want = expect(
        Phase::Forward,
        OpKind::Softmax,
        "token_mask",
        P::MaskedRow,
        "fills every position",
    );
    failures.extend(fires_as(
        &tokens,
        &factory,
        &RunOptions::default(),
        &want,
        FILE,
    ));
    let _ = DType::F16;
    all_hold("attention bugs", 2, failures);
}
