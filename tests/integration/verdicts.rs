//! Verdict rules on healthy models: a softmax classifier trained at five
//! learning rates per optimizer, up to rates high enough for an early
//! spike, gives no finding over 200 steps (no explosion, no divergence, no
//! false NaN). RMSprop at 0.1 spikes (losses 1.98, 9.0, 16.0, 4.3, 15.0)
//! over the divergence line and then trains to about 0.01: the crossing
//! recovers inside its look-ahead, so it is no finding.

use crate::explosion::mlp as classifier;
use crate::support::sgd;
use nanhunt::spec::*;
use nanhunt::{run_model, Outcome, RunOptions};

fn optimizer(kind: &str, lr: f64) -> OptimizerSpec {
    match kind {
        "sgd" => sgd(lr),
        "adam" => OptimizerSpec::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        "adamw" => OptimizerSpec::Adamw {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        },
        _ => OptimizerSpec::Rmsprop {
            lr,
            alpha: 0.99,
            eps: 1e-8,
            momentum: 0.0,
            weight_decay: 0.0,
        },
    }
}

fn case(kind: &str, lr: f64, steps: usize) -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.model = ModelSpec::Custom(CustomSpec::new(
        "classifier",
        InputSpec::Vector { features: 8 },
        4,
    ));
    c.optimizer = optimizer(kind, lr);
    c.steps = steps;
    c
}

#[test]
fn a_healthy_classifier_at_five_learning_rates_per_optimizer_gives_no_finding() {
    let grid = [
        ("sgd", [0.01, 0.03, 0.1, 0.3, 1.0]),
        ("adam", [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]),
        ("adamw", [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]),
        ("rmsprop", [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]),
    ];
    let mut found = Vec::new();
    for (kind, lrs) in grid {
        for lr in lrs {
            match run_model(&case(kind, lr, 200), &classifier, &RunOptions::default()).unwrap() {
                Outcome::Stable { trace } => println!(
                    "{kind} {lr}: stable, loss {:.3} -> {:.3}",
                    trace.losses[0],
                    trace.losses.last().unwrap()
                ),
                Outcome::Unstable { finding } => {
                    println!(
                        "{kind} {lr}: {} at step {}: {}",
                        finding.signature, finding.step, finding.detail
                    );
                    found.push(format!(
                        "{kind} {lr}: {} at {}",
                        finding.signature, finding.step
                    ));
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}
