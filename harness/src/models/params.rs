//! The parameter store: trainable variables in creation order, created with
//! the harness's seeded RNG, handed to models through a candle-nn `VarBuilder`.
//!
//! Models (built-in and users') are written against `VarBuilder` as usual.
//! The runner builds a model once to create the variables (in the master
//! dtype), then rebuilds it every step through a *compute view* that casts each
//! variable to the compute dtype. For f32/f64/f16/bf16 the cast is the
//! identity; for mixed precision it inserts the f32→half cast into the graph
//! so gradients flow back to the f32 master weights.

use crate::rng::Rng;
use crate::spec::{InitOverride, InitSpec};
use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::{Init, VarBuilder};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Store {
    vars: Vec<(String, Var)>,
    index: HashMap<String, usize>,
    /// Weights created as exact zeros by their hint (see [`ParamStore::zero_initialized`]).
    zeros: Vec<String>,
}

/// Trainable variables in creation order (the order every loop over them uses,
/// so sums over parameters are bit-reproducible).
#[derive(Clone)]
pub struct ParamStore {
    store: Arc<Mutex<Store>>,
    seed: u64,
    init: InitSpec,
    master: DType,
    device: Device,
    /// Initializations that replace the model's hints, by name or prefix.
    overrides: Arc<Vec<(String, InitOverride)>>,
}

/// Whether `name` is `pattern` or lies under it as a module prefix
/// (`encoder` matches `encoder.l1.weight`, not `encoder_2.weight`).
pub fn matches_path(name: &str, pattern: &str) -> bool {
    name == pattern
        || (name.len() > pattern.len()
            && name.starts_with(pattern)
            && name[pattern.len()..].starts_with('.'))
}

/// Suffixes of non-trainable buffers (candle-nn's BatchNorm running statistics).
const BUFFER_SUFFIXES: [&str; 2] = ["running_mean", "running_var"];

/// Whether a variable holds state, not weights (batch-norm running statistics).
pub fn is_buffer(name: &str) -> bool {
    BUFFER_SUFFIXES.iter().any(|s| name.ends_with(s))
}

impl ParamStore {
    /// A store whose variables draw from `seed` under `init`, in `master` dtype, on `device`.
    pub fn new(seed: u64, init: InitSpec, master: DType, device: Device) -> Self {
        ParamStore {
            store: Arc::default(),
            seed,
            init,
            master,
            device,
            overrides: Arc::default(),
        }
    }

    /// Replaces the hints of the named tensors (or module prefixes; the
    /// longest match wins) with these initializations.
    pub fn with_overrides(mut self, overrides: Vec<(String, InitOverride)>) -> Self {
        self.overrides = Arc::new(overrides);
        self
    }

    /// Non-bias weights the model's hint created as exact zeros: candle's
    /// `VarBuilder::get` defaults to `Init::Const(0)`, which leaves a token
    /// or an embedding that a layer norm then divides by ~sqrt(eps).
    pub fn zero_initialized(&self) -> Vec<String> {
        self.store
            .lock()
            .expect("param store poisoned")
            .zeros
            .clone()
    }

    /// A builder that creates missing variables (in the master dtype).
    pub fn creating_builder(&self) -> VarBuilder<'static> {
        VarBuilder::from_backend(
            Box::new(Backend {
                params: self.clone(),
                create: true,
            }),
            self.master,
            self.device.clone(),
        )
    }

    /// A builder that hands out the existing variables cast to `compute`.
    pub fn compute_builder(&self, compute: DType) -> VarBuilder<'static> {
        VarBuilder::from_backend(
            Box::new(Backend {
                params: self.clone(),
                create: false,
            }),
            compute,
            self.device.clone(),
        )
    }

    /// All variables (trainable and buffers) in creation order.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.store
            .lock()
            .expect("param store poisoned")
            .vars
            .clone()
    }

    /// Trainable variables in creation order.
    pub fn trainable(&self) -> Vec<(String, Var)> {
        self.vars()
            .into_iter()
            .filter(|(n, _)| !is_buffer(n))
            .collect()
    }

    /// Elements of every variable.
    pub fn count(&self) -> usize {
        self.trainable().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype variables are created in.
    pub fn master_dtype(&self) -> DType {
        self.master
    }

    /// The override for `name`: the longest key that is it or its prefix.
    fn override_for(&self, name: &str) -> Option<InitOverride> {
        self.overrides
            .iter()
            .filter(|(p, _)| matches_path(name, p))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, o)| *o)
    }

    fn create(&self, name: &str, shape: &Shape, hint: Init) -> candle_core::Result<Var> {
        let mut rng = Rng::keyed(self.seed, &format!("init.{name}"), 0);
        let gain = self.init.gain;
        let (hint, gain) = match self.override_for(name) {
            Some(InitOverride::Normal { std }) => (
                Init::Randn {
                    mean: 0.0,
                    stdev: std,
                },
                1.0,
            ),
            Some(InitOverride::Uniform { bound }) => (
                Init::Uniform {
                    lo: -bound,
                    up: bound,
                },
                1.0,
            ),
            Some(InitOverride::Const { value }) => (Init::Const(value), 1.0),
            None => {
                let leaf = name.rsplit('.').next().unwrap_or(name);
                if matches!(hint, Init::Const(c) if c == 0.0)
                    && !leaf.contains("bias")
                    && leaf != "beta"
                {
                    self.store
                        .lock()
                        .expect("param store poisoned")
                        .zeros
                        .push(name.to_string());
                }
                (hint, gain)
            }
        };
        let values = hint_values(hint, shape, gain, &self.init, &mut rng);
        let t = Tensor::from_vec(values, shape.clone(), &self.device)?.to_dtype(self.master)?;
        Var::from_tensor(&t)
    }
}

/// `shape`'s values under `hint`, drawn from `rng` and scaled by `gain`.
/// For candle-nn's Kaiming hint (its default weight), `init`'s scheme decides:
/// Kaiming keeps the hint's own fan and non-linearity, Xavier takes both
/// fans (as built-in layers do, [`init_std`]).
pub(crate) fn hint_values(
    hint: Init,
    shape: &Shape,
    gain: f64,
    init: &InitSpec,
    rng: &mut Rng,
) -> Vec<f64> {
    let n = shape.elem_count();
    match hint {
        Init::Const(c) => vec![c; n],
        Init::Randn { mean, stdev } => (0..n).map(|_| mean + gain * stdev * rng.normal()).collect(),
        Init::Uniform { lo, up } => {
            let (mid, half) = ((lo + up) / 2.0, (up - lo) / 2.0);
            (0..n)
                .map(|_| mid + gain * half * rng.uniform_in(-1.0, 1.0))
                .collect()
        }
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let std = match init.scheme {
                crate::spec::InitScheme::Kaiming => {
                    non_linearity.gain() / (fan.for_shape(shape) as f64).sqrt()
                }
                crate::spec::InitScheme::Xavier => init_std(
                    init,
                    candle_nn::init::FanInOut::FanIn.for_shape(shape),
                    candle_nn::init::FanInOut::FanOut.for_shape(shape),
                ),
            };
            match dist {
                candle_nn::init::NormalOrUniform::Normal => {
                    (0..n).map(|_| gain * std * rng.normal()).collect()
                }
                candle_nn::init::NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    (0..n)
                        .map(|_| gain * rng.uniform_in(-bound, bound))
                        .collect()
                }
            }
        }
    }
}

/// Standard deviation of a weight of shape (fan_out, fan_in, k...) under the
/// case's init scheme (the store multiplies it by the gain).
pub fn init_std(spec: &InitSpec, fan_in: usize, fan_out: usize) -> f64 {
    match spec.scheme {
        // He et al. 2015 for ReLU nets: sqrt(2 / fan_in).
        crate::spec::InitScheme::Kaiming => (2.0 / fan_in as f64).sqrt(),
        // Glorot & Bengio 2010: sqrt(2 / (fan_in + fan_out)).
        crate::spec::InitScheme::Xavier => (2.0 / (fan_in + fan_out) as f64).sqrt(),
    }
}

struct Backend {
    params: ParamStore,
    create: bool,
}

impl candle_nn::var_builder::SimpleBackend for Backend {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        hint: Init,
        dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let existing = {
            let store = self.params.store.lock().expect("param store poisoned");
            store.index.get(name).map(|&i| store.vars[i].1.clone())
        };
        let var = match existing {
            Some(v) => v,
            None if self.create => {
                let v = self.params.create(name, &shape, hint)?;
                let mut store = self.params.store.lock().expect("param store poisoned");
                let i = store.vars.len();
                store.vars.push((name.to_string(), v.clone()));
                store.index.insert(name.to_string(), i);
                v
            }
            None => candle_core::bail!(
                "parameter `{name}` was not created when the model was first built"
            ),
        };
        if var.shape() != &shape {
            candle_core::bail!(
                "parameter `{name}` requested with shape {shape:?} but has {:?}",
                var.shape()
            );
        }
        var.as_tensor().to_dtype(dtype)
    }

    fn get_unchecked(
        &self,
        name: &str,
        dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let store = self.params.store.lock().expect("param store poisoned");
        match store.index.get(name) {
            Some(&i) => store.vars[i].1.as_tensor().to_dtype(dtype),
            None => candle_core::bail!("unknown parameter `{name}`"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.params
            .store
            .lock()
            .expect("param store poisoned")
            .index
            .contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::InitScheme;

    /// The sample standard deviation of a candle-nn `linear(16, 32)` weight
    /// created under `scheme`.
    fn linear_std(scheme: InitScheme) -> f64 {
        let init = InitSpec { scheme, gain: 1.0 };
        let store = ParamStore::new(0, init, DType::F64, Device::Cpu);
        candle_nn::linear(16, 32, store.creating_builder().pp("fc")).unwrap();
        let (_, w) = store
            .vars()
            .into_iter()
            .find(|(n, _)| n == "fc.weight")
            .unwrap();
        let v: Vec<f64> = w.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
    }

    #[test]
    fn a_users_candle_nn_layer_follows_the_cases_init_scheme() {
        // Kaiming: sqrt(2/16) = 0.354; Xavier: sqrt(2/(16+32)) = 0.204.
        let (kaiming, xavier) = (
            linear_std(InitScheme::Kaiming),
            linear_std(InitScheme::Xavier),
        );
        assert!((kaiming - 0.354).abs() < 0.03, "{kaiming}");
        assert!((xavier - 0.204).abs() < 0.02, "{xavier}");
    }
}
