//! The planted-bug repair suite: numerical bugs in users' own model code,
//! each beside the model its developer fixed. For every one, the finding's
//! explanation names the pattern and the stage with numbers true of the
//! tensors, `diagnose` substitutes the stable formulation at the stage
//! through the tracer (not a guard that zeroes it), the substituted run is
//! "stable and learning" within the tolerance of the fixed model's run
//! from the same weights, and the code's cause ranks first.

use crate::support::sgd;
use candle_core::{Module, Tensor, D};
use candle_nn::{linear, linear_no_bias, Linear, VarBuilder};
use nanhunt::diagnose::{diagnose, CauseKind, Learning};
use nanhunt::explain::Pattern;
use nanhunt::losses::UserLoss;
use nanhunt::models::{Model, ModelFactory, Tracer};
use nanhunt::spec::*;
use nanhunt::{run_model, OpKind, Outcome, RunOptions};
use std::sync::Arc;

type Fwd = fn(&Net, &Tensor, &mut Tracer) -> candle_core::Result<Tensor>;

/// Two linear layers and the forward pass that uses them (the bug's or
/// its fix's): the same names, so the same initial weights.
struct Net {
    fc1: Linear,
    fc2: Linear,
    fwd: Fwd,
}

impl Model for Net {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        (self.fwd)(self, x, tr)
    }
}

/// The layers' shapes: fc1 8 → `hidden` (with or without bias), fc2
/// `head_in` → 4.
#[derive(Clone, Copy)]
struct Shape {
    hidden: usize,
    bias: bool,
    head_in: usize,
}

const MLP: Shape = Shape {
    hidden: 16,
    bias: true,
    head_in: 16,
};

fn net(shape: Shape, fwd: Fwd) -> impl ModelFactory + 'static {
    move |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let fc1 = if shape.bias {
            linear(8, shape.hidden, vb.pp("fc1"))?
        } else {
            linear_no_bias(8, shape.hidden, vb.pp("fc1"))?
        };
        Ok(Box::new(Net {
            fc1,
            fc2: linear(shape.head_in, 4, vb.pp("fc2"))?,
            fwd,
        }))
    }
}

/// One planted bug and its developer's fix.
struct Bug {
    case: Case,
    shape: Shape,
    bug: Fwd,
    fixed: Fwd,
    /// A user loss the bug is in (the fix's beside it), if not the model.
    losses: Option<(Arc<dyn UserLoss>, Arc<dyn UserLoss>)>,
    stage: &'static str,
    pattern: Pattern,
    /// Words of the explanation with its numbers, true of the tensors.
    quote: &'static str,
}

fn vector(name: &str) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(name, InputSpec::Vector { features: 8 }, 4));
    c.optimizer = sgd(0.05);
    c.steps = 30;
    c
}

fn all_zero(mut c: Case) -> Case {
    c.data.pathologies = vec![Pathology::AllZero {
        fraction: 0.1,
        from_step: 0,
    }];
    c
}

fn scaled(mut c: Case, scale: f64) -> Case {
    c.data.scale = scale;
    c
}

fn custom_loss(mut c: Case, name: &str) -> Case {
    c.loss = LossSpec::Custom {
        name: name.into(),
        targets: TargetKind::Labels,
    };
    c
}

fn relu1(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    tr.record("fc1", n.fc1.forward(x)?.relu()?)
}

// 1. log(softmax(z)) on sharp logits, the log a stage of its own.
fn log_of_softmax(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = relu1(n, x, tr)?;
    let z = tr.record("logits", (n.fc2.forward(&h)? * 60.0)?)?;
    let p = tr.record("probs", candle_nn::ops::softmax(&z, D::Minus1)?)?;
    tr.record("log_probs", p.log()?)
}

fn log_softmax_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = relu1(n, x, tr)?;
    let z = tr.record("logits", (n.fc2.forward(&h)? * 60.0)?)?;
    tr.record("log_probs", candle_nn::ops::log_softmax(&z, D::Minus1)?)
}

// 2. log(softmax(z)) in one statement: the softmax underflows inside.
fn log_softmax_inside(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = relu1(n, x, tr)?;
    let z = tr.record("logits", (n.fc2.forward(&h)? * 60.0)?)?;
    tr.record_as(
        "log_probs",
        OpKind::Log,
        candle_nn::ops::softmax(&z, D::Minus1)?.log()?,
    )
}

// 3. h / ‖h‖ without an eps, after a ReLU of a layer without bias.
fn row_norm(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = relu1(n, x, tr)?;
    let norm = h.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
    let h = tr.record("rownorm", h.broadcast_div(&norm)?)?;
    tr.record("head", n.fc2.forward(&h)?)
}

fn row_norm_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = relu1(n, x, tr)?;
    let norm = (h.sqr()?.sum_keepdim(D::Minus1)? + 1e-8)?.sqrt()?;
    let h = tr.record("rownorm", h.broadcast_div(&norm)?)?;
    tr.record("head", n.fc2.forward(&h)?)
}

// 4. sqrt(relu(h)): an infinite slope at 0 in the backward pass.
fn sqrt_relu(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = tr.record("fc1", n.fc1.forward(x)?)?;
    let s = tr.record("sqrt_relu", h.relu()?.sqrt()?)?;
    tr.record("head", n.fc2.forward(&s)?)
}

fn sqrt_relu_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = tr.record("fc1", n.fc1.forward(x)?)?;
    let s = tr.record("sqrt_relu", (h.relu()? + 1e-8)?.sqrt()?)?;
    tr.record("head", n.fc2.forward(&s)?)
}

// 5. A hand-written sigmoid, 1/(1 + exp(-h)): its exp overflows.
fn hand_sigmoid(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = tr.record("fc1", n.fc1.forward(x)?)?;
    let e = tr.record("gate_exp", h.neg()?.exp()?)?;
    let gate = tr.record("gate", (e + 1.0)?.recip()?)?;
    tr.record("head", n.fc2.forward(&gate)?)
}

fn hand_sigmoid_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = tr.record("fc1", n.fc1.forward(x)?)?;
    let gate = tr.record("gate", candle_nn::ops::sigmoid(&h)?)?;
    tr.record("head", n.fc2.forward(&gate)?)
}

// 6. exp(50·z) normalized by hand: a softmax without the max subtracted.
fn scaled_exp(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let z = tr.record("z", n.fc1.forward(x)?)?;
    let act = tr.record_as("act", OpKind::Exp, (z * 50.0)?.exp()?)?;
    let w = tr.record("weights", act.broadcast_div(&act.sum_keepdim(D::Minus1)?)?)?;
    tr.record("head", n.fc2.forward(&w)?)
}

fn scaled_exp_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let z = tr.record("z", n.fc1.forward(x)?)?;
    let w = tr.record("weights", candle_nn::ops::softmax(&(z * 50.0)?, D::Minus1)?)?;
    tr.record("head", n.fc2.forward(&w)?)
}

/// Self-attention over fc1's output as 4 positions of 4: scores and the
/// off-by-one causal mask (j >= i masked, not j > i: position 0 sees
/// nothing), filled with `fill`.
fn scores_and_mask(
    n: &Net,
    x: &Tensor,
    tr: &mut Tracer,
    fill: f32,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let q = tr.record("attn.q", n.fc1.forward(x)?.reshape(((), 4, 4))?)?;
    let scores = tr.record("attn.scores", (q.matmul(&q.t()?)? / 2.0)?)?;
    let mask: Vec<f32> = (0..4)
        .flat_map(|i| (0..4).map(move |j| if j >= i { fill } else { 0.0 }))
        .collect();
    let mask = Tensor::from_vec(mask, (4, 4), x.device())?.broadcast_as(scores.shape())?;
    Ok((q, scores, mask))
}

fn attend(n: &Net, q: &Tensor, w: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let ctx = w.matmul(q)?.mean(1)?;
    tr.record("head", n.fc2.forward(&ctx)?)
}

// 7. The off-by-one mask filled into the scores with -inf.
fn filled(n: &Net, x: &Tensor, tr: &mut Tracer, fill: f32) -> candle_core::Result<Tensor> {
    let (q, scores, mask) = scores_and_mask(n, x, tr, fill)?;
    let masked = tr.record("attn.masked", mask.ne(0.0)?.where_cond(&mask, &scores)?)?;
    let w = tr.record("attn.softmax", candle_nn::ops::softmax(&masked, D::Minus1)?)?;
    attend(n, &q, &w, tr)
}

fn masked_fill(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    filled(n, x, tr, f32::NEG_INFINITY)
}

fn masked_fill_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    filled(n, x, tr, -1e9)
}

// 8. The same mask added inside the softmax's statement.
fn added(n: &Net, x: &Tensor, tr: &mut Tracer, fill: f32) -> candle_core::Result<Tensor> {
    let (q, scores, mask) = scores_and_mask(n, x, tr, fill)?;
    let w = tr.record_as(
        "attn.softmax",
        OpKind::Softmax,
        candle_nn::ops::softmax(&(scores + mask)?, D::Minus1)?,
    )?;
    attend(n, &q, &w, tr)
}

fn mask_inside(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    added(n, x, tr, f32::NEG_INFINITY)
}

fn mask_inside_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    added(n, x, tr, -1e9)
}

// 9. The log of a linear output as a Poisson rate: negative rates.
fn log_rate(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = relu1(n, x, tr)?;
    let rate = tr.record("rate", n.fc2.forward(&h)?)?;
    tr.record("log_rate", rate.log()?)
}

fn log_rate_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = relu1(n, x, tr)?;
    let rate = tr.record("rate", n.fc2.forward(&h)?)?;
    tr.record("log_rate", rate.maximum(1e-8)?.log()?)
}

// 10. A batch norm by hand without eps over a dead unit's constant column.
fn hand_bn(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = tr.record("h", dead_unit(n, x)?)?;
    let c = h.broadcast_sub(&h.mean_keepdim(0)?)?;
    let std = c.sqr()?.mean_keepdim(0)?.sqrt()?;
    let bn = tr.record_as("bn", OpKind::Norm, c.broadcast_div(&std)?)?;
    tr.record("head", n.fc2.forward(&bn)?)
}

fn hand_bn_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = tr.record("h", dead_unit(n, x)?)?;
    let c = h.broadcast_sub(&h.mean_keepdim(0)?)?;
    let var = c.sqr()?.mean_keepdim(0)?;
    let bn = tr.record_as("bn", OpKind::Norm, c.broadcast_div(&(var + 1e-5)?.sqrt()?)?)?;
    tr.record("head", n.fc2.forward(&bn)?)
}

/// relu(fc1(x)) with unit 0 dead (its output forced to exactly 0).
fn dead_unit(n: &Net, x: &Tensor) -> candle_core::Result<Tensor> {
    let h = n.fc1.forward(x)?.relu()?;
    let keep: Vec<f32> = (0..h.dim(1)?).map(|j| f32::from(j != 0)).collect();
    h.broadcast_mul(&Tensor::new(keep, x.device())?)
}

// 11. A survival curve as a cumulative product of sharp gates, and its
// hazard as the ratio of the curve to itself shifted by one: the product
// underflows to 0 and the ratio is 0/0.
fn survival(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let g = tr.record(
        "gates",
        candle_nn::ops::sigmoid(&(n.fc1.forward(x)? * 20.0)?)?,
    )?;
    let mut s = vec![g.narrow(1, 0, 1)?];
    for j in 1..g.dim(1)? {
        let next = (&s[j - 1] * g.narrow(1, j, 1)?)?;
        s.push(next);
    }
    let s = tr.record("survival", Tensor::cat(&s, 1)?)?;
    let k = s.dim(1)?;
    let hazard = s
        .narrow(1, 1, k - 1)?
        .broadcast_div(&s.narrow(1, 0, k - 1)?)?;
    let hazard = tr.record("hazard", hazard)?;
    tr.record("head", n.fc2.forward(&hazard)?)
}

fn survival_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    // The ratio of consecutive survival values is the next gate itself.
    let g = tr.record(
        "gates",
        candle_nn::ops::sigmoid(&(n.fc1.forward(x)? * 20.0)?)?,
    )?;
    let k = g.dim(1)?;
    let hazard = tr.record("hazard", g.narrow(1, 1, k - 1)?)?;
    tr.record("head", n.fc2.forward(&hazard)?)
}

// 12. The modulus of pairs, sqrt(a² + b²), at the origin: relu'd pairs
// of a layer without bias are both 0.
fn modulus(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let pairs = tr.record("pairs", n.fc1.forward(x)?.relu()?.reshape(((), 8, 2))?)?;
    let m = tr.record("modulus", pairs.sqr()?.sum(D::Minus1)?.sqrt()?)?;
    tr.record("head", n.fc2.forward(&m)?)
}

fn modulus_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let pairs = tr.record("pairs", n.fc1.forward(x)?.relu()?.reshape(((), 8, 2))?)?;
    let m = tr.record("modulus", (pairs.sqr()?.sum(D::Minus1)? + 1e-8)?.sqrt()?)?;
    tr.record("head", n.fc2.forward(&m)?)
}

// 16. A logsumexp pooling written as log(sum(exp(h))): exp overflows.
fn lse_pool(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = tr.record("scores", n.fc1.forward(x)?)?;
    let pooled = tr.record_as("pool", OpKind::Log, h.exp()?.sum_keepdim(D::Minus1)?.log()?)?;
    tr.record("head", n.fc2.forward(&pooled)?)
}

fn lse_pool_fixed(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = tr.record("scores", n.fc1.forward(x)?)?;
    let m = h.max_keepdim(D::Minus1)?;
    let lse = (h.broadcast_sub(&m)?.exp()?.sum_keepdim(D::Minus1)?.log()? + m)?;
    let pooled = tr.record_as("pool", OpKind::Log, lse)?;
    tr.record("head", n.fc2.forward(&pooled)?)
}

/// Sharp logits: a softmax of them underflows to exact zeros in f32.
fn sharp(n: &Net, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
    let h = relu1(n, x, tr)?;
    tr.record("logits", (n.fc2.forward(&h)? * 60.0)?)
}

// 13. A cross-entropy by hand, -(t · log(softmax(z))): 0 · log(0) = NaN.
fn xent(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let p = nanhunt::trace("probs", candle_nn::ops::softmax(z, D::Minus1)?)?;
    let terms = (t * p.log()?)?;
    nanhunt::trace_as(
        "xent",
        OpKind::Loss,
        terms.sum(D::Minus1)?.neg()?.mean_all()?,
    )
}

fn xent_fixed(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let terms = (t * candle_nn::ops::log_softmax(z, D::Minus1)?)?;
    nanhunt::trace_as(
        "xent",
        OpKind::Loss,
        terms.sum(D::Minus1)?.neg()?.mean_all()?,
    )
}

// 14. A binary cross-entropy by hand on sigmoid gates that saturate to 1.
fn bce(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let g = nanhunt::trace("gate", candle_nn::ops::sigmoid(z)?)?;
    let one_minus = (1.0 - &g)?;
    let terms = ((t * g.log()?)? + ((1.0 - t)? * one_minus.log()?)?)?.neg()?;
    nanhunt::trace_as("bce", OpKind::Loss, terms)?.mean_all()
}

fn bce_fixed(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    // On the logits: max(z, 0) - z·t + log(1 + exp(-|z|)).
    let softplus = (z.abs()?.neg()?.exp()? + 1.0)?.log()?;
    let terms = ((z.relu()? - (z * t)?)? + softplus)?;
    nanhunt::trace_as("bce", OpKind::Loss, terms)?.mean_all()
}

// 15. A KL divergence with eps 0 against smoothed targets, on
// predictions with exact zeros: log(t/0) = +inf.
fn kl(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let p = nanhunt::trace("probs", candle_nn::ops::softmax(z, D::Minus1)?)?;
    let t = ((t * 0.9)? + 0.025)?;
    let terms = (&t * (t.broadcast_div(&p)?).log()?)?;
    nanhunt::trace_as("kl", OpKind::Loss, terms)?
        .sum(D::Minus1)?
        .mean_all()
}

fn kl_fixed(z: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
    let logp = candle_nn::ops::log_softmax(z, D::Minus1)?;
    let t = ((t * 0.9)? + 0.025)?;
    let terms = (&t * (t.log()? - logp)?)?;
    nanhunt::trace_as("kl", OpKind::Loss, terms)?
        .sum(D::Minus1)?
        .mean_all()
}

fn losses(
    bug: fn(&Tensor, &Tensor) -> candle_core::Result<Tensor>,
    fixed: fn(&Tensor, &Tensor) -> candle_core::Result<Tensor>,
) -> Option<(Arc<dyn UserLoss>, Arc<dyn UserLoss>)> {
    Some((Arc::new(bug), Arc::new(fixed)))
}

fn suite() -> Vec<Bug> {
    let bias_free = Shape { bias: false, ..MLP };
    let bug = |case, shape, bug, fixed, stage, pattern, quote| Bug {
        case,
        shape,
        bug,
        fixed,
        losses: None,
        stage,
        pattern,
        quote,
    };
    vec![
        bug(
            vector("log_of_softmax"),
            MLP,
            log_of_softmax,
            log_softmax_fixed,
            "log_probs",
            Pattern::LogOfZero,
            "that are exactly 0",
        ),
        bug(
            vector("log_softmax_inside"),
            MLP,
            log_softmax_inside,
            log_softmax_fixed,
            "log_probs",
            Pattern::LogOfUnderflowedSoftmax,
            "span more than 103.3",
        ),
        bug(
            all_zero(vector("row_norm")),
            bias_free,
            row_norm,
            row_norm_fixed,
            "rownorm",
            Pattern::ZeroNormRow,
            "rows of the batch",
        ),
        bug(
            vector("sqrt_relu"),
            MLP,
            sqrt_relu,
            sqrt_relu_fixed,
            "sqrt_relu",
            Pattern::InfiniteSlopeAtZero,
            "at exactly 0",
        ),
        bug(
            scaled(vector("hand_sigmoid"), 30.0),
            MLP,
            hand_sigmoid,
            hand_sigmoid_fixed,
            "gate_exp",
            Pattern::ExpOverflow,
            "88.7",
        ),
        bug(
            vector("scaled_exp"),
            MLP,
            scaled_exp,
            scaled_exp_fixed,
            "act",
            Pattern::ExpOfScaledInput,
            "multiplies it by at least",
        ),
        bug(
            vector("masked_fill"),
            Shape { head_in: 4, ..MLP },
            masked_fill,
            masked_fill_fixed,
            "attn.softmax",
            Pattern::MaskedRow,
            "entirely -inf",
        ),
        bug(
            vector("mask_inside"),
            Shape { head_in: 4, ..MLP },
            mask_inside,
            mask_inside_fixed,
            "attn.softmax",
            Pattern::MaskInsideSoftmax,
            "rows are NaN in every position",
        ),
        bug(
            vector("log_rate"),
            MLP,
            log_rate,
            log_rate_fixed,
            "log_rate",
            Pattern::NegativeDomain,
            "that are negative",
        ),
        bug(
            vector("hand_bn"),
            MLP,
            hand_bn,
            hand_bn_fixed,
            "bn",
            Pattern::ConstantNormalized,
            "column 0 holds 0 in all",
        ),
        bug(
            vector("survival"),
            Shape { head_in: 15, ..MLP },
            survival,
            survival_fixed,
            "hazard",
            Pattern::ShiftedRatio,
            "along dimension 1 divide by 0",
        ),
        bug(
            all_zero(vector("modulus")),
            Shape {
                head_in: 8,
                ..bias_free
            },
            modulus,
            modulus_fixed,
            "modulus",
            Pattern::RootOfReducedZero,
            "are all zeros",
        ),
        bug(
            scaled(vector("lse_pool"), 30.0),
            Shape { head_in: 1, ..MLP },
            lse_pool,
            lse_pool_fixed,
            "pool",
            Pattern::LogOfOverflowedExp,
            "rows have an entry above 88.7",
        ),
        Bug {
            losses: losses(xent, xent_fixed),
            ..bug(
                custom_loss(vector("xent"), "xent"),
                MLP,
                sharp,
                sharp,
                "xent",
                Pattern::ZeroTimesLogOfZero,
                "values exactly 0",
            )
        },
        Bug {
            losses: losses(bce, bce_fixed),
            ..bug(
                custom_loss(vector("bce"), "bce"),
                MLP,
                sharp,
                sharp,
                "bce",
                Pattern::SaturatedGate,
                "at exactly 1",
            )
        },
        Bug {
            losses: losses(kl, kl_fixed),
            ..bug(
                custom_loss(vector("kl"), "kl"),
                MLP,
                sharp,
                sharp,
                "kl",
                Pattern::DivisionByZero,
                "that are exactly 0",
            )
        },
    ]
}

fn opts(loss: Option<&Arc<dyn UserLoss>>) -> RunOptions {
    match loss {
        Some(l) => RunOptions::default().with_loss(l.clone()),
        None => RunOptions::default(),
    }
}

/// What went wrong with one planted bug, or `None`.
fn check(b: &Bug) -> Option<String> {
    let name = b.stage;
    let (bug_loss, fixed_loss) = match &b.losses {
        Some((bug, fixed)) => (Some(bug), Some(fixed)),
        None => (None, None),
    };
    // The developer's fixed model, from the same weights, trains stably.
    let fixed = run_model(&b.case, &net(b.shape, b.fixed), &opts(fixed_loss)).unwrap();
    let Some(reference) = Learning::of(&fixed) else {
        return Some(format!("{name}: the fixed model is {fixed:?}"));
    };
    let factory = net(b.shape, b.bug);
    let o = run_model(&b.case, &factory, &opts(bug_loss)).unwrap();
    let Outcome::Unstable { finding } = o else {
        return Some(format!("{name}: no finding ({})", o.verdict()));
    };
    let Some(e) = finding.explanation.as_deref() else {
        return Some(format!("{name}: no explanation: {}", finding.detail));
    };
    if (e.stage.as_str(), e.pattern) != (b.stage, b.pattern) || !e.sentence.contains(b.quote) {
        return Some(format!(
            "{name}: explained as {:?} at `{}`: {}",
            e.pattern, e.stage, e.sentence
        ));
    }
    let d = diagnose(&b.case, &factory, &opts(bug_loss)).unwrap();
    let top = &d.causes[0];
    let fix = &top.fixes[0];
    let substituted = fix
        .intervention
        .as_ref()
        .is_some_and(|i| i.substitute.is_some());
    if top.kind != CauseKind::CodeBug || !substituted || !fix.verified {
        let ranked: Vec<_> = d
            .causes
            .iter()
            .map(|c| format!("{} [{}]: {}", c.title, c.score, c.fixes[0].result))
            .collect();
        return Some(format!("{name}: {} — ranked {ranked:#?}", fix.description));
    }
    if !fix.result.starts_with("stable and learning") {
        return Some(format!("{name}: {}", fix.result));
    }
    let learned = fix.learning.expect("a stable fix has its learning");
    let line = format!(
        "{name}: {:?}; {}; the fixed model {:.4} -> {:.4}",
        b.pattern, fix.result, reference.first_loss, reference.final_loss
    );
    // `cargo test repairs -- --nocapture` prints the suite's table.
    println!("{line}");
    (!learned.learns(&reference)).then(|| format!("{line}: behind the fixed model"))
}

#[test]
fn every_planted_bug_is_explained_repaired_by_its_stable_formulation_and_learns_like_its_fix() {
    let bugs = suite();
    assert!(bugs.len() >= 16);
    let failures: Vec<String> = bugs.iter().filter_map(check).collect();
    assert!(
        failures.is_empty(),
        "{} of {} planted bugs:\n{}",
        failures.len(),
        bugs.len(),
        failures.join("\n")
    );
}

/// A user's KL divergence head as its authors wrote it, with the eps a
/// declared knob at 0: log(p + eps) of a softmax of sharp logits, which
/// underflows to exact zeros. The knob's fix (eps 1e-8) is verified as
/// learning and ranks first; a smaller init, which only removes the
/// trigger, ranks below it.
struct KlHead {
    fc1: Linear,
    fc2: Linear,
    eps: f64,
}

impl Model for KlHead {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("fc1", self.fc1.forward(x)?.relu()?)?;
        let z = tr.record("logits", (self.fc2.forward(&h)? * 60.0)?)?;
        let p = tr.record("probs", candle_nn::ops::softmax(&z, D::Minus1)?)?;
        tr.record_as("log_q", OpKind::Log, (p + self.eps)?.log()?)
    }
}

#[test]
fn a_kl_heads_eps_knob_at_zero_is_repaired_by_the_knob_and_ranks_above_the_init() {
    use nanhunt::models::{Knobs, WithKnobs};
    let mut case = vector("kl_head");
    let ModelSpec::Custom(spec) = &mut case.model else {
        unreachable!()
    };
    spec.knobs.insert(
        "eps".into(),
        KnobSpec::new(0.0, 0.0, 1e-8).at_stage("log_q"),
    );
    let factory = WithKnobs(
        |vb: VarBuilder<'static>, knobs: &Knobs| -> candle_core::Result<Box<dyn Model>> {
            Ok(Box::new(KlHead {
                fc1: linear(8, 16, vb.pp("fc1"))?,
                fc2: linear(16, 4, vb.pp("fc2"))?,
                eps: knobs.get_or("eps", 0.0),
            }))
        },
    );
    let d = diagnose(&case, &factory, &RunOptions::default()).unwrap();
    let ranked: Vec<_> = d
        .causes
        .iter()
        .map(|c| format!("{} [{}]: {}", c.title, c.score, c.fixes[0].result))
        .collect();
    let top = &d.causes[0];
    assert_eq!(top.kind, CauseKind::ModelKnob, "{ranked:#?}");
    let fix = top
        .fixes
        .iter()
        .find(|f| f.verified)
        .unwrap_or_else(|| panic!("{ranked:#?} {:#?}", top.fixes));
    assert!(
        fix.result.starts_with("stable and learning"),
        "{}",
        fix.result
    );
    println!("{}: {}", fix.description, fix.result);
    let init = d.causes.iter().position(|c| c.kind == CauseKind::InitScale);
    assert!(init.is_none_or(|i| i > 0), "{ranked:#?}");
}
