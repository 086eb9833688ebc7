//! Optimizer, learning-rate schedule and gradient clipping.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerSpec {
    Sgd {
        lr: f64,
        #[serde(default)]
        momentum: f64,
        #[serde(default)]
        nesterov: bool,
        #[serde(default)]
        weight_decay: f64,
    },
    /// Adam with L2 weight decay added to the gradient (PyTorch's Adam).
    Adam {
        lr: f64,
        #[serde(default = "beta1")]
        beta1: f64,
        #[serde(default = "beta2")]
        beta2: f64,
        #[serde(default = "adam_eps")]
        eps: f64,
        #[serde(default)]
        weight_decay: f64,
    },
    /// Adam with decoupled weight decay (PyTorch's AdamW).
    Adamw {
        lr: f64,
        #[serde(default = "beta1")]
        beta1: f64,
        #[serde(default = "beta2")]
        beta2: f64,
        #[serde(default = "adam_eps")]
        eps: f64,
        #[serde(default = "adamw_decay")]
        weight_decay: f64,
    },
    /// RMSprop (PyTorch's, without centering).
    Rmsprop {
        lr: f64,
        #[serde(default = "rms_alpha")]
        alpha: f64,
        #[serde(default = "adam_eps")]
        eps: f64,
        #[serde(default)]
        momentum: f64,
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
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerSpec::Sgd { .. } => "sgd",
            OptimizerSpec::Adam { .. } => "adam",
            OptimizerSpec::Adamw { .. } => "adamw",
            OptimizerSpec::Rmsprop { .. } => "rmsprop",
        }
    }

    pub fn lr(&self) -> f64 {
        match *self {
            OptimizerSpec::Sgd { lr, .. }
            | OptimizerSpec::Adam { lr, .. }
            | OptimizerSpec::Adamw { lr, .. }
            | OptimizerSpec::Rmsprop { lr, .. } => lr,
        }
    }

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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScheduleSpec {
    #[default]
    Constant,
    /// Linear ramp from lr/warmup_steps to lr over `warmup_steps`, then constant.
    Warmup { warmup_steps: usize },
    /// Optional linear warm-up, then cosine decay to `min_factor`·lr at the last step.
    Cosine {
        #[serde(default)]
        warmup_steps: usize,
        #[serde(default)]
        min_factor: f64,
    },
    /// lr · gamma^(step / step_size).
    Step { step_size: usize, gamma: f64 },
}

impl ScheduleSpec {
    pub fn name(&self) -> &'static str {
        match self {
            ScheduleSpec::Constant => "constant",
            ScheduleSpec::Warmup { .. } => "warmup",
            ScheduleSpec::Cosine { .. } => "cosine",
            ScheduleSpec::Step { .. } => "step",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClipSpec {
    #[default]
    None,
    /// Scale all gradients so that their global L2 norm is at most max_norm.
    Norm { max_norm: f64 },
    /// Clamp every gradient entry to [-value, value].
    Value { value: f64 },
}
