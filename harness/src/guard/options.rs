//! How a guard checks, where it writes the scene, and how it can build the
//! user's model again at another precision (for the precision check).

use super::Batch;
use candle_core::{DType, Result, Tensor};
use std::path::PathBuf;
use std::sync::Arc;

/// How a guard checks and where it writes the scene. Built from
/// `GuardOptions::default()` and the builder methods (fields may be added:
/// the struct is `#[non_exhaustive]`), or by setting its public fields.
#[derive(Clone)]
#[non_exhaustive]
pub struct GuardOptions {
    /// The name signatures give the model (`family`).
    pub name: String,
    /// Write the scene of the first failure here (it must not exist yet).
    pub dump: Option<PathBuf>,
    /// Divergence: the smoothed loss exceeds this many times its best.
    pub divergence_factor: f64,
    /// The loss of a model that has learned nothing (ln C for a C-class
    /// cross-entropy): a jump's recovery is judged against it when it is
    /// below the best loss before the jump. `None`: the best loss alone.
    pub chance_loss: Option<f64>,
    /// Only tensors whose dump name starts with one of these go into the
    /// scene (`param/encoder.`, `batch/`); empty: all. Bounds its size.
    pub include: Vec<String>,
    /// Variables (or module prefixes: `encoder` covers `encoder.l1.weight`)
    /// that are deliberately not trained: they need no gradient, and the
    /// guard's optimizer leaves them alone.
    pub frozen: Vec<String>,
    /// Builds the model again at another precision, so that a finding gets
    /// the precision check a runner's finding gets; without it the
    /// finding's check says it was not run.
    pub rebuild: Option<Rebuild>,
}

/// Builds the user's model again in `dtype`: a fresh `VarMap` whose
/// variables have the guarded names, and the loss closure over the model
/// built on it.
pub type Rebuild = Arc<dyn Fn(DType) -> Result<Rebuilt> + Send + Sync>;

/// A loss closure over a batch, as a guarded step takes it.
pub type LossFn = Box<dyn FnMut(&Batch) -> Result<Tensor>>;

/// The model built again by a [`Rebuild`].
pub struct Rebuilt {
    /// The model's variables.
    pub varmap: candle_nn::VarMap,
    /// Its loss over a batch.
    pub loss: LossFn,
}

impl Rebuilt {
    /// The model built again: its variables and its loss.
    pub fn new(
        varmap: candle_nn::VarMap,
        loss: impl FnMut(&Batch) -> Result<Tensor> + 'static,
    ) -> Self {
        Rebuilt {
            varmap,
            loss: Box::new(loss),
        }
    }
}

impl Default for GuardOptions {
    fn default() -> Self {
        GuardOptions {
            name: "user".into(),
            dump: None,
            divergence_factor: 4.0,
            chance_loss: None,
            include: Vec::new(),
            frozen: Vec::new(),
            rebuild: None,
        }
    }
}

impl std::fmt::Debug for GuardOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardOptions")
            .field("name", &self.name)
            .field("dump", &self.dump)
            .field("divergence_factor", &self.divergence_factor)
            .field("chance_loss", &self.chance_loss)
            .field("include", &self.include)
            .field("frozen", &self.frozen)
            .field(
                "rebuild",
                &self.rebuild.as_ref().map(|_| "a rebuild closure"),
            )
            .finish()
    }
}

impl GuardOptions {
    /// Write each finding's scene under `dir`.
    pub fn dump_to(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dump = Some(dir.into());
        self
    }

    /// The loop's name in its findings' signatures (its family).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Declares variables (or module prefixes) frozen.
    pub fn frozen<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.frozen.extend(names.into_iter().map(Into::into));
        self
    }

    /// The divergence line: the smoothed loss above `factor` × its best.
    pub fn divergence_factor(mut self, factor: f64) -> Self {
        self.divergence_factor = factor;
        self
    }

    /// A `classes`-way classifier trained with cross-entropy: a jump's
    /// recovery is judged against the chance level ln(classes).
    pub fn classes(mut self, classes: usize) -> Self {
        let cross_entropy = crate::spec::LossSpec::CrossEntropy {
            label_smoothing: 0.0,
        };
        self.chance_loss = cross_entropy.chance_loss(classes);
        self
    }

    /// The chance level of the loss, for the recovery of a jump.
    pub fn chance_loss(mut self, loss: f64) -> Self {
        self.chance_loss = Some(loss);
        self
    }

    /// Only these tensor-name prefixes go into the scene.
    pub fn include<S: Into<String>>(mut self, prefixes: impl IntoIterator<Item = S>) -> Self {
        self.include.extend(prefixes.into_iter().map(Into::into));
        self
    }

    /// How to build the model again at another precision (the precision
    /// check of findings):
    ///
    /// ```ignore
    /// GuardOptions::default().rebuild(|dtype| {
    ///     let varmap = VarMap::new();
    ///     let model = Net::new(VarBuilder::from_varmap(&varmap, dtype, &Device::Cpu))?;
    ///     Ok(Rebuilt::new(varmap, move |b| model.loss(b)))
    /// })
    /// ```
    pub fn rebuild(
        mut self,
        rebuild: impl Fn(DType) -> Result<Rebuilt> + Send + Sync + 'static,
    ) -> Self {
        self.rebuild = Some(Arc::new(rebuild));
        self
    }
}
