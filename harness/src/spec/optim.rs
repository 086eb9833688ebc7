//! Optimizer, learning-rate schedule and gradient clipping.

use serde::{Deserialize, Serialize};

/// The optimizer of a case, with PyTorch's semantics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerSpec {
    /// Stochastic gradient descent (PyTorch's SGD).
    Sgd {
        /// The learning rate.
        lr: f64,
        /// The momentum factor (0: none).
        #[serde(default)]
        momentum: f64,
        /// Nesterov momentum.
        #[serde(default)]
        nesterov: bool,
        /// L2 weight decay added to the gradient.
        #[serde(default)]
        weight_decay: f64,
    },
    /// Adam with L2 weight decay added to the gradient (PyTorch's Adam).
    Adam {
        /// The learning rate.
        lr: f64,
        /// The first moment's decay.
        #[serde(default = "beta1")]
        beta1: f64,
        /// The second moment's decay.
        #[serde(default = "beta2")]
        beta2: f64,
        /// Added to the denominator's root.
        #[serde(default = "adam_eps")]
        eps: f64,
        /// L2 weight decay added to the gradient.
        #[serde(default)]
        weight_decay: f64,
    },
    /// Adam with decoupled weight decay (PyTorch's AdamW).
    Adamw {
        /// The learning rate.
        lr: f64,
        /// The first moment's decay.
        #[serde(default = "beta1")]
        beta1: f64,
        /// The second moment's decay.
        #[serde(default = "beta2")]
        beta2: f64,
        /// Added to the denominator's root.
        #[serde(default = "adam_eps")]
        eps: f64,
        /// Decoupled weight decay.
        #[serde(default = "adamw_decay")]
        weight_decay: f64,
    },
    /// RMSprop (PyTorch's, without centering).
    Rmsprop {
        /// The learning rate.
        lr: f64,
        /// The squared gradient's decay.
        #[serde(default = "rms_alpha")]
        alpha: f64,
        /// Added to the denominator's root.
        #[serde(default = "adam_eps")]
        eps: f64,
        /// The momentum factor (0: none).
        #[serde(default)]
        momentum: f64,
        /// L2 weight decay added to the gradient.
        #[serde(default)]
        weight_decay: f64,
    },
}

fn beta1() -> f64 {
    0.9
}
fn beta2() -> f64 {
    0.999
}
fn adam_eps() -> f64 {
    1e-8
}
fn adamw_decay() -> f64 {
    0.01
}
fn rms_alpha() -> f64 {
    0.99
}

impl OptimizerSpec {
    /// The optimizer's name (`sgd`, `adam`, `adamw`, `rmsprop`).
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerSpec::Sgd { .. } => "sgd",
            OptimizerSpec::Adam { .. } => "adam",
            OptimizerSpec::Adamw { .. } => "adamw",
            OptimizerSpec::Rmsprop { .. } => "rmsprop",
        }
    }

    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match *self {
            OptimizerSpec::Sgd { lr, .. }
            | OptimizerSpec::Adam { lr, .. }
            | OptimizerSpec::Adamw { lr, .. }
            | OptimizerSpec::Rmsprop { lr, .. } => lr,
        }
    }

    /// Sets the base learning rate.
    pub fn set_lr(&mut self, value: f64) {
        match self {
            OptimizerSpec::Sgd { lr, .. }
            | OptimizerSpec::Adam { lr, .. }
            | OptimizerSpec::Adamw { lr, .. }
            | OptimizerSpec::Rmsprop { lr, .. } => *lr = value,
        }
    }

    /// The eps of the update's denominator (None for SGD, which has none).
    pub fn eps(&self) -> Option<f64> {
        match *self {
            OptimizerSpec::Sgd { .. } => None,
            OptimizerSpec::Adam { eps, .. }
            | OptimizerSpec::Adamw { eps, .. }
            | OptimizerSpec::Rmsprop { eps, .. } => Some(eps),
        }
    }

    /// The eps of the update's denominator, to change it. Written as a full
    /// match so that a new optimizer must say whether it has one.
    pub fn eps_mut(&mut self) -> Option<&mut f64> {
        match self {
            OptimizerSpec::Sgd { .. } => None,
            OptimizerSpec::Adam { eps, .. }
            | OptimizerSpec::Adamw { eps, .. }
            | OptimizerSpec::Rmsprop { eps, .. } => Some(eps),
        }
    }
}

/// The learning-rate schedule over a run's steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScheduleSpec {
    /// The base rate throughout.
    #[default]
    Constant,
    /// Linear ramp from lr/warmup_steps to lr over `warmup_steps`, then constant.
    Warmup {
        /// Steps of the ramp.
        warmup_steps: usize,
    },
    /// Optional linear warm-up, then cosine decay to `min_factor`·lr at the last step.
    Cosine {
        /// Steps of the linear warm-up (0: none).
        #[serde(default)]
        warmup_steps: usize,
        /// The final rate as a fraction of the base rate.
        #[serde(default)]
        min_factor: f64,
    },
    /// lr · gamma^(step / step_size).
    Step {
        /// Steps between decays.
        step_size: usize,
        /// The decay factor.
        gamma: f64,
    },
}

impl ScheduleSpec {
    /// The schedule's name.
    pub fn name(&self) -> &'static str {
        match self {
            ScheduleSpec::Constant => "constant",
            ScheduleSpec::Warmup { .. } => "warmup",
            ScheduleSpec::Cosine { .. } => "cosine",
            ScheduleSpec::Step { .. } => "step",
        }
    }
}

/// Gradient clipping before the update.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClipSpec {
    /// No clipping.
    #[default]
    None,
    /// Scale all gradients so that their global L2 norm is at most max_norm.
    Norm {
        /// The largest global norm.
        max_norm: f64,
    },
    /// Clamp every gradient entry to [-value, value].
    Value {
        /// The largest magnitude of an entry.
        value: f64,
    },
}
