//! The divergence rule in a user's loop: crossing 4x the best smoothed loss
//! is judged over the steps after it (at most 50, the average's memory),
//! and a crossing judged diverged is a finding at the step that crossed,
//! with its scene. A healthy early spike that trains on is no finding.
//! The loop's losses are scripted through the batch.

use crate::support::*;
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use nanhunt::guard::{Batch, Guard, GuardError, GuardOptions};
use nanhunt::spec::OptimizerSpec;
use nanhunt::FindingKind;

/// The loss of a step: the batch's scripted value, with a gradient of 1
/// on every element of `w` (the optimizer's rate is 0: nothing moves).
fn loss(w: &Tensor, b: &Batch) -> candle_core::Result<Tensor> {
    let zero = (w - w.detach())?.sum_all()?;
    zero.broadcast_add(&b.get("loss")?.sum_all()?)
}

fn batch(value: f32) -> Batch {
    Batch::new([("loss", Tensor::new(&[value], &Device::Cpu).unwrap())])
}

/// Runs `script` through a guard; the error of the first finding (or of
/// `finish`), with the guard's varmap and `w` for a replay.
fn guarded(script: &[f32], dump: Option<std::path::PathBuf>) -> Result<(), GuardError> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let w = vb
        .get_with_hints(4, "w", candle_nn::Init::Const(1.0))
        .unwrap();
    let mut opts = GuardOptions::default().named("scripted");
    opts.dump = dump;
    let mut guard = Guard::new(&varmap, opts).unwrap();
    let mut opt = guard
        .optimizer(OptimizerSpec::Sgd {
            lr: 0.0,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        })
        .unwrap();
    for (step, &v) in script.iter().enumerate() {
        guard.step(step, &batch(v), &mut opt, |b| loss(&w, b))?;
    }
    guard.finish(&opt)
}

fn finding(r: Result<(), GuardError>) -> nanhunt::Finding {
    match r {
        Err(GuardError::Unstable { finding, .. }) => *finding,
        other => panic!("expected a finding, got {other:?}"),
    }
}

/// A loss of 1 for ten steps, then `then` for `steps` more.
fn plateau(then: f32, steps: usize) -> Vec<f32> {
    let mut s = vec![1.0; 10];
    s.extend(std::iter::repeat_n(then, steps));
    s
}

/// The step a plateau's smoothed loss crosses 4x the best, as the tracker says.
fn crossing_step(script: &[f32]) -> usize {
    let mut t = nanhunt::probe::DivergenceTracker::new(4.0);
    script
        .iter()
        .position(|&l| {
            t.push(l as f64);
            t.crossed_now()
        })
        .expect("the script crosses the line")
}

#[test]
fn a_healthy_spike_that_trains_on_is_no_finding() {
    let mut script = vec![1.98, 9.0, 16.0, 4.3, 15.0];
    script.extend(std::iter::repeat_n(0.01, 200));
    guarded(&script, None).unwrap();
}

#[test]
fn a_crossing_never_recovered_is_a_divergence_at_the_step_that_crossed() {
    let script = plateau(6.0, 200);
    let crossed = crossing_step(&script);
    let dir_root = scratch("divergence-lookahead");
    let dir = dir_root.join("scene");
    let f = finding(guarded(&script, Some(dir.clone())));
    assert_eq!((f.kind, f.step), (FindingKind::Divergence, crossed));
    assert!(
        f.detail.contains("had not recovered 50 steps later"),
        "{}",
        f.detail
    );
    assert_eq!(f.trace.losses.len(), crossed + 1);
    // The scene is the crossing step's; its replay sees the crossing.
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let w = vb
        .get_with_hints(4, "w", candle_nn::Init::Const(0.0))
        .unwrap();
    let r = nanhunt::guard::replay(&dir, &varmap, |b| loss(&w, b)).unwrap();
    assert!(r.reproduced(), "{}", r.message);
    assert!(r.message.contains("divergence"), "{}", r.message);
}

#[test]
fn a_crossing_still_above_when_the_loop_ends_is_judged_by_finish() {
    let script = plateau(6.0, 40);
    let crossed = crossing_step(&script);
    assert!(
        crossed + 50 > script.len(),
        "the loop ends inside the look-ahead"
    );
    let f = finding(guarded(&script, None));
    assert_eq!((f.kind, f.step), (FindingKind::Divergence, crossed));
    assert!(f.detail.contains("when the run ended"), "{}", f.detail);
}

#[test]
fn a_loss_far_past_the_line_stops_the_loop_at_once() {
    let script = plateau(1e4, 5);
    let f = finding(guarded(&script, None));
    assert_eq!((f.kind, f.step), (FindingKind::Divergence, 10));
    assert!(f.detail.contains("exceeds 16 x the best"), "{}", f.detail);
}
