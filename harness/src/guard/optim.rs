//! Optimizers whose state a guard can save and restore: nanhunt's SGD,
//! Adam, AdamW and RMSprop (PyTorch's update rules) as a
//! `candle_nn::Optimizer`, a drop-in for candle-nn's; and candle-nn's own
//! `SGD` and `AdamW`, which step but whose state is private (a guard's
//! dump says so).

use crate::optim::{Optimizer, UpdateScans};
pub use crate::scene::OptimizerRecord;
use crate::spec::OptimizerSpec;
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

/// An optimizer's state as a dump saves it.
#[derive(Clone, Debug)]
pub struct SavedOptimizer {
    /// The optimizer's spec.
    pub spec: OptimizerSpec,
    /// Completed update steps.
    pub steps: usize,
    /// `m.<index>`, `v.<index>`, `momentum.<index>` by variable index.
    pub tensors: Vec<(String, Tensor)>,
}

impl SavedOptimizer {
    /// The state as `<kind>.<name>`, its variables named by `names` (in
    /// the optimizer's order): `m.3` → `m.<names[3]>`.
    pub fn named_state(&self, names: &[String]) -> Vec<(String, Tensor)> {
        self.tensors
            .iter()
            .map(|(key, t)| {
                let (kind, index) = key.split_once('.').unwrap_or((key, ""));
                let name = index
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| names.get(i))
                    .cloned()
                    .unwrap_or_else(|| index.to_string());
                (format!("{kind}.{name}"), t.clone())
            })
            .collect()
    }
}

/// What a guard needs of an optimizer: a step, and its state if it can.
pub trait GuardOptimizer {
    /// One update from these gradients.
    fn apply(&mut self, grads: &GradStore) -> Result<()>;
    /// How dumps name it.
    fn name(&self) -> String;
    /// Its state, if it can be read (and restored).
    fn saved(&self) -> Option<SavedOptimizer> {
        None
    }
    /// The variables it updates, in its order, if it tells them.
    fn vars(&self) -> Option<Vec<Var>> {
        None
    }
    /// Restores a saved state (an optimizer that cannot read it ignores it).
    fn restore(&mut self, _saved: &SavedOptimizer) -> Result<()> {
        Ok(())
    }
    /// Whether [`GuardOptimizer::prepare`] computes updates ahead (then
    /// the guard checks them before they are set, and needs no copy of the
    /// parameters to undo a step).
    fn can_prepare(&self) -> bool {
        false
    }
    /// The variables' values after one update, computed but not set (the
    /// optimizer's state is not advanced either): `None` when it cannot
    /// tell before it steps. [`GuardOptimizer::commit`] applies them.
    fn prepare(&mut self, _grads: &GradStore) -> Result<Option<Vec<Tensor>>> {
        Ok(None)
    }
    /// Sets what [`GuardOptimizer::prepare`] computed and advances the state.
    fn commit(&mut self, _new: Vec<Tensor>) -> Result<()> {
        Ok(())
    }
    /// What the pass that prepared the update saw of the values it wrote,
    /// where it saw them (nanhunt's fused pass on the CPU): the guard then
    /// reads them instead of scanning the tensors again.
    fn prepared_scans(&self) -> Option<&UpdateScans> {
        None
    }
    /// Whether it updates exactly `vars`, in that order: then its
    /// per-variable scans line up with the guard's variables.
    fn updates_exactly(&self, _vars: &[Var]) -> bool {
        false
    }
    /// Whether the last [`GuardOptimizer::prepare`] found a gradient for
    /// every variable it updates (read in its own pass over the gradients:
    /// the guard's coverage check then needs no lookups of its own).
    fn prepared_every_gradient(&self) -> bool {
        false
    }
    /// The state a prepared update would leave, as (variable index in the
    /// optimizer's order, kind, tensor): checked with the parameters, as
    /// the runner checks its optimizer's state.
    fn prepared_state(&self) -> Vec<(usize, &'static str, Tensor)> {
        Vec::new()
    }
    /// The first tensor of [`GuardOptimizer::prepared_state`] that holds a
    /// NaN or an infinity, if any (the guard's check of it every step).
    fn non_finite_prepared_state(
        &self,
    ) -> crate::error::Result<Option<(usize, &'static str, Tensor)>> {
        let state = self.prepared_state();
        let tensors: Vec<&Tensor> = state.iter().map(|(_, _, t)| t).collect();
        Ok(crate::probe::first_non_finite(&tensors)?.map(|i| state[i].clone()))
    }
}

/// nanhunt's optimizers as a `candle_nn::Optimizer` over a list of variables.
pub struct NanhuntOptimizer {
    vars: Vec<Var>,
    inner: Optimizer,
    spec: OptimizerSpec,
    lr: f64,
    /// The state after a prepared update, until it is committed
    /// (`staged`); then the state before the last commit, whose tensors
    /// the next prepared update replaces one by one.
    next: Optimizer,
    staged: bool,
    /// What the last prepared update's pass saw: read while it is
    /// staged, and its lists reused by the next one.
    scans: Option<UpdateScans>,
    /// Whether every variable had a gradient in the last prepared update.
    every_gradient: bool,
    /// The variables' indices as names (`0`, `1`, …), built once: the
    /// state is saved by them before every step.
    index_names: Vec<String>,
}

impl NanhuntOptimizer {
    /// The variables in the order they were given (a guard's order).
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// The state a prepared update would leave, until it is committed.
    fn staged(&self) -> Option<&Optimizer> {
        self.staged.then_some(&self.next)
    }

    /// Each variable's gradient, zeros where it has none; and whether
    /// every one had one.
    fn grads_of(&self, grads: &GradStore) -> Result<(Vec<Tensor>, bool)> {
        let mut every = true;
        let list = self
            .vars
            .iter()
            .map(|v| match grads.get(v.as_tensor()) {
                Some(g) => Ok(g.clone()),
                None => {
                    every = false;
                    v.as_tensor().zeros_like()
                }
            })
            .collect::<Result<_>>()?;
        Ok((list, every))
    }
}

impl candle_nn::Optimizer for NanhuntOptimizer {
    type Config = OptimizerSpec;

    fn new(vars: Vec<Var>, spec: OptimizerSpec) -> Result<Self> {
        Ok(NanhuntOptimizer {
            inner: Optimizer::new(&spec, vars.len()),
            next: Optimizer::new(&spec, vars.len()),
            lr: spec.lr(),
            spec,
            index_names: (0..vars.len()).map(|i| i.to_string()).collect(),
            staged: false,
            vars,
            scans: None,
            every_gradient: false,
        })
    }

    /// A variable without a gradient gets a zero one (candle-nn skips it;
    /// a guard reports it before the step).
    fn step(&mut self, grads: &GradStore) -> Result<()> {
        let (grads, _) = self.grads_of(grads)?;
        self.inner.step(&self.vars, &grads, self.lr)
    }

    fn learning_rate(&self) -> f64 {
        self.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }
}

impl GuardOptimizer for NanhuntOptimizer {
    fn apply(&mut self, grads: &GradStore) -> Result<()> {
        candle_nn::Optimizer::step(self, grads)
    }

    fn name(&self) -> String {
        self.spec.name().to_string()
    }

    fn vars(&self) -> Option<Vec<Var>> {
        Some(self.vars.clone())
    }

    fn can_prepare(&self) -> bool {
        true
    }

    fn prepare(&mut self, grads: &GradStore) -> Result<Option<Vec<Tensor>>> {
        let (grads, every) = self.grads_of(grads)?;
        self.every_gradient = every;
        // Into the staging optimizer: the state only advances at commit.
        let reuse = self.scans.take();
        let (new, scans) =
            self.next
                .update_checked_from(&self.inner, (&self.vars, &grads), self.lr, reuse)?;
        self.staged = true;
        self.scans = scans;
        Ok(Some(new))
    }

    fn commit(&mut self, new: Vec<Tensor>) -> Result<()> {
        for (v, t) in self.vars.iter().zip(&new) {
            v.set(t)?;
        }
        if std::mem::take(&mut self.staged) {
            std::mem::swap(&mut self.inner, &mut self.next);
        }
        Ok(())
    }

    fn prepared_scans(&self) -> Option<&UpdateScans> {
        self.scans.as_ref().filter(|_| self.staged)
    }

    fn prepared_every_gradient(&self) -> bool {
        self.staged && self.every_gradient
    }

    fn updates_exactly(&self, vars: &[Var]) -> bool {
        self.vars.len() == vars.len()
            && self
                .vars
                .iter()
                .zip(vars)
                .all(|(a, b)| a.as_tensor().id() == b.as_tensor().id())
    }

    fn prepared_state(&self) -> Vec<(usize, &'static str, Tensor)> {
        self.staged()
            .iter()
            .flat_map(|o| o.state_tensors().map(|(i, k, t)| (i, k, t.clone())))
            .collect()
    }

    /// Walks the prepared state in place: no list of it every step.
    fn non_finite_prepared_state(
        &self,
    ) -> crate::error::Result<Option<(usize, &'static str, Tensor)>> {
        if let Some(scans) = self.prepared_scans() {
            // The pass checked it: the tensor only for the failure.
            let bad = scans.bad_state.and_then(|at| {
                let (i, kind, t) = self.staged()?.state_tensors().nth(at)?;
                Some((i, kind, t.clone()))
            });
            return Ok(bad);
        }
        for (i, kind, t) in self.staged().iter().flat_map(|o| o.state_tensors()) {
            if crate::probe::first_non_finite(&[t])?.is_some() {
                return Ok(Some((i, kind, t.clone())));
            }
        }
        Ok(None)
    }

    fn saved(&self) -> Option<SavedOptimizer> {
        let mut spec = self.spec.clone();
        spec.set_lr(self.lr);
        Some(SavedOptimizer {
            spec,
            steps: self.inner.steps(),
            tensors: self.inner.state(&self.index_names),
        })
    }

    fn restore(&mut self, saved: &SavedOptimizer) -> Result<()> {
        let mut inner = Optimizer::new(&saved.spec, self.vars.len());
        inner.restore(saved.steps, &self.index_names, |key| {
            saved
                .tensors
                .iter()
                .find(|(n, _)| n == key)
                .map(|(_, t)| t.clone())
        });
        self.inner = inner;
        self.staged = false;
        self.lr = saved.spec.lr();
        Ok(())
    }
}

impl GuardOptimizer for candle_nn::AdamW {
    fn apply(&mut self, grads: &GradStore) -> Result<()> {
        candle_nn::Optimizer::step(self, grads)
    }

    fn name(&self) -> String {
        "candle_nn::AdamW".into()
    }
}

impl GuardOptimizer for candle_nn::SGD {
    fn apply(&mut self, grads: &GradStore) -> Result<()> {
        candle_nn::Optimizer::step(self, grads)
    }

    fn name(&self) -> String {
        "candle_nn::SGD".into()
    }
}

/// The optimizer's variables by guard name, where it tells them.
pub(super) fn opt_var_names<O: GuardOptimizer + ?Sized>(
    opt: &O,
    vars: &[Var],
    names: &[String],
) -> Vec<String> {
    opt.vars()
        .unwrap_or_default()
        .iter()
        .map(|v| {
            vars.iter()
                .position(|g| g.as_tensor().id() == v.as_tensor().id())
                .map_or_else(|| "(not guarded)".to_string(), |i| names[i].clone())
        })
        .collect()
}
