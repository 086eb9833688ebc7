//! The state a training step changes, captured before it.

use crate::finding::TraceMark;
use crate::optim::Optimizer;
use crate::probe::DivergenceTracker;
use crate::scaler::LossScaler;
use candle_core::Tensor;

/// Everything a step changes, taken before it: the state a failing step is
/// re-run from (for localization), and what a crash dump saves and a replay
/// restores. Taken every step while the probe is on, so it holds no copy of
/// the (growing) history, only its length.
#[derive(Clone)]
pub struct Snapshot {
    /// Parameter values in creation order (deep copies: `Var::set` writes in place).
    pub params: Vec<Tensor>,
    /// The optimizer's state.
    pub optimizer: Optimizer,
    /// The loss scaler.
    pub scaler: LossScaler,
    /// The divergence tracker.
    pub tracker: DivergenceTracker,
    /// The history's length.
    pub history: TraceMark,
}
