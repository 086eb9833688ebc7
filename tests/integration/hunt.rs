//! Latent NaNs: bugs in users' own model code (and custom losses) that
//! training on the data never fires, as real projects wrote them. `hunt`
//! triggers each one from the trained state, names the stage, reports the
//! perturbation it needed and writes a reproducer that replays without any
//! search; the same models with the stable formulation give no trigger
//! within the same bound.

use crate::support::{scratch, sgd};
use candle_core::{Module, Tensor, D};
use candle_nn::{linear, Linear, VarBuilder};
use nanhunt::hunt::{hunt, HuntOptions, RiskReport, RiskStatus, TriggerKind};
use nanhunt::losses::UserLoss;
use nanhunt::models::{Model, ModelFactory, Tracer};
use nanhunt::spec::*;
use nanhunt::{run_model, OpKind, Outcome, RunOptions};
use std::sync::Arc;

fn vector(name: &str) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(name, InputSpec::Vector { features: 8 }, 4));
    c.optimizer = sgd(0.05);
    c.steps = 20;
    c.batch_size = 8;
    c
}

struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

fn mlp(vb: &VarBuilder, hidden: usize) -> candle_core::Result<Mlp> {
    Ok(Mlp {
        fc1: linear(8, hidden, vb.pp("fc1"))?,
        fc2: linear(hidden, 4, vb.pp("fc2"))?,
    })
}

/// 1 / (1 + exp(-h)), written by hand.
fn sigmoid_by_hand(h: &Tensor) -> candle_core::Result<Tensor> {
    (h.neg()?.exp()? + 1.0)?.recip()
}

/// log(1 + exp(-|h|)) + relu(h): softplus without overflow.
fn softplus(h: &Tensor) -> candle_core::Result<Tensor> {
    (h.abs()?.neg()?.exp()? + 1.0)?.log()? + h.relu()?
}

/// The patterns, each as written (`buggy`) and as repaired.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Bug {
    /// log(1 − σ(h)) with a hand-written sigmoid: σ rounds to 1, log 0.
    LogOneMinusSigmoid,
    /// log(softmax(z)): the softmax underflows to 0 for large logit gaps.
    LogOfSoftmax,
    /// A free energy −log Σ exp(−E) summed as written: exp overflows.
    FreeEnergy,
    /// A softmax over pixels without the max subtracted: exp overflows.
    PixelSoftmax,
    /// log of a group's variance: every unit of the group off, var 0.
    LogVariance,
    /// x / RMS(x) without an eps: an all-zero sample is 0/0.
    RmsWithoutEps,
}

struct Latent {
    bug: Bug,
    fixed: bool,
    m: Mlp,
    /// The variance's group of units (its own layer).
    group: Option<Linear>,
}

impl Model for Latent {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        if self.bug == Bug::RmsWithoutEps {
            let eps = if self.fixed { 1e-6 } else { 0.0 };
            let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
            let xn = tr.record_as("rms_norm", OpKind::Norm, x.broadcast_div(&rms)?)?;
            let h = tr.record_as("fc1", OpKind::Linear, self.m.fc1.forward(&xn)?)?;
            return tr.record_as("head", OpKind::Linear, self.m.fc2.forward(&h.relu()?)?);
        }
        let h = tr.record_as("fc1", OpKind::Linear, self.m.fc1.forward(x)?)?;
        let h = match (self.bug, self.fixed) {
            (Bug::LogOneMinusSigmoid, false) => {
                let p = tr.record("gate", sigmoid_by_hand(&h)?)?;
                tr.record_as("log_1m_p", OpKind::Log, p.affine(-1.0, 1.0)?.log()?)?
            }
            (Bug::LogOneMinusSigmoid, true) => tr.record("log_1m_p", softplus(&h)?.neg()?)?,
            (Bug::LogOfSoftmax, _) => {
                let z = tr.record("logits", (self.m.fc2.forward(&h)? * 3.0)?)?;
                return match self.fixed {
                    false => {
                        let p = candle_nn::ops::softmax(&z, D::Minus1)?;
                        tr.record_as("log_probs", OpKind::Log, p.log()?)
                    }
                    true => tr.record_as(
                        "log_probs",
                        OpKind::LogSoftmax,
                        candle_nn::ops::log_softmax(&z, D::Minus1)?,
                    ),
                };
            }
            (Bug::FreeEnergy, false) => {
                let e = tr.record_as("boltzmann", OpKind::Exp, (h.neg()? * 4.0)?.exp()?)?;
                let f =
                    tr.record_as("free_energy", OpKind::Log, e.sum_keepdim(D::Minus1)?.log()?)?;
                h.broadcast_add(&f)?
            }
            (Bug::FreeEnergy, true) => {
                let a = (h.neg()? * 4.0)?;
                let max = a.max_keepdim(D::Minus1)?;
                let f = (a
                    .broadcast_sub(&max)?
                    .exp()?
                    .sum_keepdim(D::Minus1)?
                    .log()?
                    + &max)?;
                h.broadcast_add(&tr.record("free_energy", f)?)?
            }
            (Bug::PixelSoftmax, false) => {
                let e = tr.record_as("attn.exp", OpKind::Exp, (h * 4.0)?.exp()?)?;
                tr.record_as(
                    "attn.div",
                    OpKind::Div,
                    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?,
                )?
            }
            (Bug::PixelSoftmax, true) => {
                tr.record("attn", candle_nn::ops::softmax(&(h * 4.0)?, D::Minus1)?)?
            }
            (Bug::LogVariance, fixed) => {
                let group = self.group.as_ref().expect("the variance's group");
                // Units that are on for the data (their bias lifted by 1).
                let g = tr.record("group", (group.forward(x)? + 1.0)?.relu()?)?;
                let mean = g.mean_keepdim(D::Minus1)?;
                let var = g.broadcast_sub(&mean)?.sqr()?.mean_keepdim(D::Minus1)?;
                let eps = if fixed { 1e-5 } else { 0.0 };
                let lv = tr.record_as("log_var", OpKind::Log, (var + eps)?.log()?)?;
                h.broadcast_add(&lv)?
            }
            (Bug::RmsWithoutEps, _) => unreachable!("handled above"),
        };
        tr.record_as("head", OpKind::Linear, self.m.fc2.forward(&h.relu()?)?)
    }
}

fn latent(bug: Bug, fixed: bool) -> impl ModelFactory {
    move |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(Latent {
            bug,
            fixed,
            m: mlp(&vb, 16)?,
            group: match bug {
                Bug::LogVariance => Some(linear(8, 6, vb.pp("group"))?),
                _ => None,
            },
        }))
    }
}

/// A custom loss with a latent bug: a Poisson NLL on log-rates written as
/// exp(z) − t·z (exp overflows), or a BCE by hand, −t·log σ − (1−t)·log(1−σ)
/// (log of 0).
#[derive(Clone, Copy, PartialEq, Debug)]
enum LossBug {
    PoissonExp,
    BceByHand,
}

fn custom_loss(bug: LossBug, fixed: bool) -> Arc<dyn UserLoss> {
    Arc::new(
        move |z: &Tensor, t: &Tensor| -> candle_core::Result<Tensor> {
            match (bug, fixed) {
                (LossBug::PoissonExp, false) => {
                    let rate = nanhunt::trace_as("loss.rate", OpKind::Exp, z.exp()?)?;
                    (rate - (t * z)?)?.mean_all()
                }
                // The rate kept in log space past 10: exp(10 + ln(1 + (z − 10))).
                (LossBug::PoissonExp, true) => {
                    let capped = z.clamp(-30.0, 10.0)?;
                    let rate = nanhunt::trace(
                        "loss.rate",
                        (capped.exp()? * ((z - &capped)?.relu()? + 1.0)?)?,
                    )?;
                    (rate - (t * z)?)?.mean_all()
                }
                (LossBug::BceByHand, false) => {
                    let p = sigmoid_by_hand(z)?;
                    let lp = nanhunt::trace_as("loss.log_p", OpKind::Log, p.log()?)?;
                    let l1p = nanhunt::trace_as(
                        "loss.log_1m_p",
                        OpKind::Log,
                        p.affine(-1.0, 1.0)?.log()?,
                    )?;
                    ((t * lp)? + (t.affine(-1.0, 1.0)? * l1p)?)?
                        .neg()?
                        .mean_all()
                }
                (LossBug::BceByHand, true) => {
                    let lp = nanhunt::trace("loss.log_p", softplus(&z.neg()?)?.neg()?)?;
                    let l1p = nanhunt::trace("loss.log_1m_p", softplus(z)?.neg()?)?;
                    ((t * lp)? + (t.affine(-1.0, 1.0)? * l1p)?)?
                        .neg()?
                        .mean_all()
                }
            }
        },
    )
}

fn plain_mlp(vb: VarBuilder) -> candle_core::Result<Box<dyn Model>> {
    struct Plain(Mlp);
    impl Model for Plain {
        fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
            let h = tr.record_as("fc1", OpKind::Linear, self.0.fc1.forward(x)?.relu()?)?;
            tr.record_as("head", OpKind::Linear, self.0.fc2.forward(&h)?)
        }
    }
    Ok(Box::new(Plain(mlp(&vb, 16)?)))
}

fn loss_case(name: &str, targets: TargetKind) -> Case {
    let mut c = vector(name);
    c.loss = LossSpec::Custom {
        name: name.into(),
        targets,
    };
    c
}

/// Trains stably on its own data.
fn assert_stable(case: &Case, factory: &dyn ModelFactory, opts: &RunOptions) {
    match run_model(case, factory, opts).unwrap() {
        Outcome::Stable { .. } => {}
        other => panic!("{}: the data itself fires it: {other:?}", case.family()),
    }
}

/// The hunt's status of `stage`.
fn status<'r>(report: &'r RiskReport, stage: &str) -> &'r RiskStatus {
    &report
        .stages
        .iter()
        .find(|s| s.stage == stage)
        .unwrap_or_else(|| panic!("no risky stage `{stage}` in {}", report.to_markdown()))
        .status
}

/// A custom loss's buggy and repaired forms, and the targets they take.
type LossPair = (Arc<dyn UserLoss>, Arc<dyn UserLoss>, TargetKind);

/// The latent bug fires only in the hunt: at `stage`, with a reproducer
/// that replays; the repaired model gives no trigger within the bound.
fn assert_hunted(
    case: Case,
    (buggy, fixed): (&dyn ModelFactory, &dyn ModelFactory),
    loss: Option<LossPair>,
    stage: &str,
) -> TriggerKind {
    let name = case.family().to_string();
    let run = |l: Option<&Arc<dyn UserLoss>>| match l {
        Some(l) => RunOptions::default().with_loss(l.clone()),
        None => RunOptions::default(),
    };
    let (run_buggy, run_fixed) = (
        run(loss.as_ref().map(|l| &l.0)),
        run(loss.as_ref().map(|l| &l.1)),
    );
    assert_stable(&case, buggy, &run_buggy);
    let out = scratch(&format!("hunt-{name}"));
    let mut opts = HuntOptions::default().out_to(&*out);
    opts.run = run_buggy.clone();
    let report = hunt(&case, buggy, &opts).unwrap();
    let RiskStatus::Triggered(t) = status(&report, stage) else {
        panic!(
            "{name}: `{stage}` was not triggered:\n{}",
            report.to_markdown()
        );
    };
    let by = t.by.clone();
    eprintln!("{name}: `{stage}` triggered by {by:?}");
    if let TriggerKind::Input { perturbation, .. } = t.by {
        assert!(
            perturbation > 0.0 && perturbation <= 200.0,
            "{name}: {perturbation}"
        );
    }
    // The reproducer replays with no search, from `cargo test`.
    let dir = out.join(t.reproducer.as_ref().expect("a reproducer was written"));
    let replayed = nanhunt::replay::replay(&dir, Some(buggy), &run_buggy).unwrap();
    assert!(replayed.reproduced(), "{name}: {}", replayed.message);
    let f = replayed.actual.unwrap();
    // And the whole directory, as a user's regression test replays it.
    let all = nanhunt::regression::replay_dir(&out, Some(buggy), &run_buggy).unwrap();
    assert!(all.iter().any(|(p, _)| *p == dir), "{name}: {all:?}");
    assert!(all.iter().all(|(_, r)| r.reproduced()), "{name}: {all:?}");
    assert!(
        f.stage == stage || f.explanation.as_ref().is_some_and(|e| e.stage == stage),
        "{name}: the reproducer fails at `{}`",
        f.stage
    );
    // Explained like any finding: a known pattern at the stage.
    let e = f.explanation.as_ref().expect("explained");
    assert!(
        e.pattern != nanhunt::explain::Pattern::Unexplained,
        "{name}: {}",
        e.sentence
    );
    // The stable formulation holds within the same bound.
    assert_stable(&case, fixed, &run_fixed);
    opts.out = None;
    opts.run = run_fixed;
    let report = hunt(&case, fixed, &opts).unwrap();
    assert!(
        !report.found(),
        "{name}, repaired:\n{}",
        report.to_markdown()
    );
    by
}

#[test]
fn the_hunt_triggers_latent_bugs_in_a_models_code_that_training_never_fires() {
    for (bug, stage) in [
        (Bug::LogOneMinusSigmoid, "log_1m_p"),
        (Bug::LogOfSoftmax, "log_probs"),
        (Bug::FreeEnergy, "boltzmann"),
        (Bug::PixelSoftmax, "attn.exp"),
        (Bug::LogVariance, "log_var"),
        (Bug::RmsWithoutEps, "rms_norm"),
    ] {
        let name = format!("{bug:?}").to_lowercase();
        let (buggy, fixed) = (latent(bug, false), latent(bug, true));
        assert_hunted(vector(&name), (&buggy, &fixed), None, stage);
    }
}

#[test]
fn the_hunt_triggers_latent_bugs_inside_a_custom_loss() {
    for (bug, stage, targets) in [
        (LossBug::PoissonExp, "loss.rate", TargetKind::Counts),
        (LossBug::BceByHand, "loss.log_1m_p", TargetKind::Binary),
    ] {
        let name = format!("{bug:?}").to_lowercase();
        let losses = (custom_loss(bug, false), custom_loss(bug, true), targets);
        let case = loss_case(&name, targets);
        assert_hunted(case, (&plain_mlp, &plain_mlp), Some(losses), stage);
    }
}

/// A bag-of-tokens classifier whose softmax over its (rectified,
/// sharpened) class scores is written by hand, with no max subtracted: on
/// the training data's mixed tokens the summed embedding stays moderate; a
/// sequence of the tokens that push one class hardest overflows the exp.
struct BagOfTokens {
    embed: candle_nn::Embedding,
    head: Linear,
    fixed: bool,
}

impl Model for BagOfTokens {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let e = tr.record_as("embed", OpKind::Embedding, self.embed.forward(x)?)?;
        let z = (self.head.forward(&e.sum(1)?)?.relu()? * 3.0)?;
        if self.fixed {
            return tr.record("log_probs", candle_nn::ops::log_softmax(&z, D::Minus1)?);
        }
        let ez = tr.record_as("class_exp", OpKind::Exp, z.exp()?)?;
        let p = ez.broadcast_div(&ez.sum_keepdim(D::Minus1)?)?;
        tr.record_as("log_probs", OpKind::Log, p.log()?)
    }
}

fn bag_of_tokens(fixed: bool) -> impl ModelFactory {
    move |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(BagOfTokens {
            embed: candle_nn::embedding(32, 8, vb.pp("embed"))?,
            head: linear(8, 4, vb.pp("head"))?,
            fixed,
        }))
    }
}

#[test]
fn the_hunt_swaps_tokens_through_the_embedding_to_trigger_a_token_models_latent_bug() {
    let mut case = vector("bag_of_tokens");
    case.model = ModelSpec::Custom(CustomSpec::new(
        "bag_of_tokens",
        InputSpec::Tokens {
            seq_len: 16,
            vocab: 32,
        },
        4,
    ));
    let (buggy, fixed) = (bag_of_tokens(false), bag_of_tokens(true));
    let by = assert_hunted(case, (&buggy, &fixed), None, "class_exp");
    let TriggerKind::Tokens { swapped, rows } = by else {
        panic!("not a token trigger: {by:?}");
    };
    assert!((1..=16).contains(&swapped) && rows >= 1, "{by:?}");
}

/// The built-in encoder masks padded keys; with a mask of -inf (instead of
/// BERT's -10000) a sequence of padding only is a softmax over a fully
/// masked row, 0/0. Its training data always has real tokens
/// (`min_length`); the hunt pads one row and fires it, and the reproducer
/// replays. With the additive mask the same row attends uniformly: no
/// trigger.
#[test]
fn the_hunt_pads_a_row_to_fire_a_softmax_over_a_fully_masked_row() {
    let hunted = |mask: MaskKind| {
        let mut case = Case::example("encoder").unwrap();
        let ModelSpec::Encoder(e) = &mut case.model else {
            unreachable!()
        };
        e.mask = mask;
        case.steps = 10;
        let factory = nanhunt::models::BuiltinFactory::new(&case.model).unwrap();
        let label = if mask == MaskKind::NegInf {
            "neg-inf"
        } else {
            "additive"
        };
        let out = scratch(&format!("hunt-encoder-{label}"));
        let opts = HuntOptions::default().without_drift().out_to(&*out);
        let report = hunt(&case, &factory, &opts).unwrap();
        if let RiskStatus::Triggered(t) = &report
            .stages
            .iter()
            .find(|s| s.stage.ends_with("attn.softmax"))
            .unwrap()
            .status
        {
            let dir = out.join(t.reproducer.as_ref().expect("a reproducer"));
            let replayed =
                nanhunt::replay::replay(&dir, Some(&factory), &RunOptions::default()).unwrap();
            assert!(replayed.reproduced(), "{}", replayed.message);
        }
        let stage = report
            .stages
            .iter()
            .find(|s| s.stage.ends_with("attn.softmax"))
            .unwrap_or_else(|| panic!("no softmax stage:\n{}", report.to_markdown()))
            .clone();
        (stage, report)
    };
    let (stage, report) = hunted(MaskKind::NegInf);
    let RiskStatus::Triggered(t) = &stage.status else {
        panic!("not triggered:\n{}", report.to_markdown());
    };
    assert!(
        matches!(t.by, TriggerKind::Tokens { rows: 1, .. }),
        "{:?}",
        t.by
    );
    // The encoder applies its -inf mask between two records: the softmax
    // stage read finite scores and made whole rows of NaN, a mask added
    // inside the stage (not a log of negatives).
    let explained = t.explanation.as_deref().unwrap_or_default();
    assert!(
        explained.contains("a mask added inside the stage left those rows no position"),
        "{explained}"
    );
    let (stage, report) = hunted(MaskKind::Additive { value: -10000.0 });
    assert!(
        matches!(stage.status, RiskStatus::NoTokenTrigger { .. }),
        "{}",
        report.to_markdown()
    );
}
