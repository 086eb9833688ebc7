//! Seeded randomness for a user's own model, so that a guarded loop is
//! reproducible bit for bit: candle's CPU RNG (behind `VarMap`'s
//! initialization, `Dropout`, `randn_like`) cannot be seeded.
//!
//! - [`var_builder`]: a `VarBuilder` that creates a `VarMap`'s variables
//!   from the harness's RNG, keyed by the seed and each variable's name
//!   (the same values whatever order the model creates them in), with the
//!   hints' distributions (candle-nn's Kaiming default, `Randn`, …).
//! - [`Dropout`]: its mask keyed by the seed, its name, the step and how
//!   many masks it drew before in that call of the loss: a replay of the
//!   step draws the same mask. The guard and the runner say which step a
//!   forward pass belongs to ([`at_step`]).

use super::params::hint_values;
use crate::rng::Rng;
use crate::spec::InitSpec;
use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::{Init, VarBuilder, VarMap};
use std::cell::RefCell;
use std::collections::HashMap;

/// A builder over `varmap` whose new variables are drawn from the
/// harness's RNG under `seed`; variables already in the map are reused.
pub fn var_builder(
    varmap: &VarMap,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> VarBuilder<'static> {
    let backend = SeededMap {
        varmap: varmap.clone(),
        seed,
    };
    VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
}

struct SeededMap {
    varmap: VarMap,
    seed: u64,
}

impl candle_nn::var_builder::SimpleBackend for SeededMap {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        hint: Init,
        dtype: DType,
        dev: &Device,
    ) -> Result<Tensor> {
        let mut vars = self.varmap.data().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = vars.get(name) {
            if v.shape() != &shape {
                candle_core::bail!(
                    "variable `{name}` requested with shape {shape:?} but has {:?}",
                    v.shape()
                );
            }
            return v.as_tensor().to_dtype(dtype);
        }
        let mut rng = Rng::keyed(self.seed, &format!("init.{name}"), 0);
        let values = hint_values(hint, &shape, 1.0, &InitSpec::default(), &mut rng);
        let var = Var::from_tensor(&Tensor::from_vec(values, shape, dev)?.to_dtype(dtype)?)?;
        vars.insert(name.to_string(), var.clone());
        Ok(var.as_tensor().clone())
    }

    fn get_unchecked(&self, name: &str, dtype: DType, _dev: &Device) -> Result<Tensor> {
        let vars = self.varmap.data().lock().unwrap_or_else(|e| e.into_inner());
        match vars.get(name) {
            Some(v) => v.as_tensor().to_dtype(dtype),
            None => candle_core::bail!("unknown variable `{name}`"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        let vars = self.varmap.data().lock().unwrap_or_else(|e| e.into_inner());
        vars.contains_key(name)
    }
}

/// The step a forward pass belongs to, and the masks drawn in it so far.
struct Scope {
    step: u64,
    draws: HashMap<String, u64>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
    /// Draws outside any step (a loop that is not guarded): a stream per
    /// name, reproducible from the start of the thread only.
    static UNSCOPED: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
}

/// Runs `f` (one forward pass and loss) as step `step`'s: the seeded
/// draws inside it start afresh, so running it again draws the same.
pub fn at_step<R>(step: u64, f: impl FnOnce() -> R) -> R {
    let fresh = Scope {
        step,
        draws: HashMap::new(),
    };
    let outer = SCOPE.with(|s| s.borrow_mut().replace(fresh));
    let out = f();
    SCOPE.with(|s| *s.borrow_mut() = outer);
    out
}

/// The key of `name`'s next draw: (step, draws before it in the step),
/// or the unscoped stream's (u64::MAX, count).
fn next_draw(name: &str) -> (u64, u64) {
    let scoped = SCOPE.with(|s| {
        s.borrow_mut().as_mut().map(|scope| {
            let n = scope.draws.entry(name.to_string()).or_insert(0);
            *n += 1;
            (scope.step, *n - 1)
        })
    });
    scoped.unwrap_or_else(|| {
        UNSCOPED.with(|u| {
            let mut u = u.borrow_mut();
            let n = u.entry(name.to_string()).or_insert(0);
            *n += 1;
            (u64::MAX, *n - 1)
        })
    })
}

/// Dropout with a seeded mask: in training each value is zeroed with
/// probability `p` and the rest scaled by 1/(1 − p), as candle-nn's.
#[derive(Clone, Debug)]
pub struct Dropout {
    p: f64,
    seed: u64,
    name: String,
}

impl Dropout {
    /// `name` tells this dropout's masks from the model's others'.
    pub fn new(p: f64, seed: u64, name: impl Into<String>) -> Self {
        Dropout {
            p,
            seed,
            name: name.into(),
        }
    }

    /// `x` with the mask applied in training; `x` itself otherwise.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if !(0.0..1.0).contains(&self.p) {
            candle_core::bail!("dropout probability must be in [0, 1), got {}", self.p);
        }
        if !train || self.p == 0.0 {
            return Ok(x.clone());
        }
        let (step, draw) = next_draw(&self.name);
        let key = format!("dropout.{}.{step}", self.name);
        let mut rng = Rng::keyed(self.seed, &key, draw);
        let keep = 1.0 / (1.0 - self.p);
        let mask: Vec<f32> = (0..x.elem_count())
            .map(|_| {
                if rng.uniform() < self.p {
                    0.0
                } else {
                    keep as f32
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        x * mask
    }
}

impl candle_nn::ModuleT for Dropout {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        Dropout::forward_t(self, x, train)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_varmap_has_the_same_values_whatever_the_creation_order() {
        let make = |names: &[&str]| {
            let varmap = VarMap::new();
            let vb = var_builder(&varmap, 7, DType::F32, &Device::Cpu);
            for n in names {
                vb.get_with_hints((4, 3), n, candle_nn::init::DEFAULT_KAIMING_NORMAL)
                    .unwrap();
            }
            let vars = varmap.data().lock().unwrap().clone();
            let value = |n: &str| {
                vars[n]
                    .as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            (value("a"), value("b"))
        };
        let (a1, b1) = make(&["a", "b"]);
        let (a2, b2) = make(&["b", "a"]);
        assert_eq!((&a1, &b1), (&a2, &b2));
        assert_ne!(a1, b1);
        // Kaiming normal with fan-in 3 and the ReLU gain: std sqrt(2/3).
        let std = (a1.iter().map(|v| v * v).sum::<f32>() / 12.0).sqrt();
        assert!((0.3..1.5).contains(&std), "{std}");
    }

    #[test]
    fn seeded_dropout_draws_the_same_mask_when_a_step_runs_again() {
        let x = Tensor::ones((8, 16), DType::F32, &Device::Cpu).unwrap();
        let d = Dropout::new(0.5, 3, "drop");
        let twice = |step| {
            at_step(step, || {
                let a = d.forward_t(&x, true).unwrap().to_vec2::<f32>().unwrap();
                let b = d.forward_t(&x, true).unwrap().to_vec2::<f32>().unwrap();
                (a, b)
            })
        };
        let (a, b) = twice(5);
        assert_eq!(
            twice(5),
            (a.clone(), b.clone()),
            "the step again: the same masks"
        );
        assert_ne!(a, b, "two draws in one step differ");
        assert_ne!(twice(6).0, a, "another step, another mask");
        let zeros = a.iter().flatten().filter(|v| **v == 0.0).count();
        assert!((32..96).contains(&zeros), "{zeros} of 128 dropped");
        assert!(a.iter().flatten().all(|v| *v == 0.0 || *v == 2.0));
        let eval = d.forward_t(&x, false).unwrap().to_vec2::<f32>().unwrap();
        assert!(eval.iter().flatten().all(|v| *v == 1.0));
    }
}
