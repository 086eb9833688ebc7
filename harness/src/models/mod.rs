//! The model zoo and the trait that users' own candle models implement.
//!
//! A model is built from a candle-nn `VarBuilder` (see [`params`]) and runs
//! forward with a [`Tracer`] that records named intermediate tensors when
//! localization asks for them; with tracing off, recording is one branch.

mod cnn;
mod decoder;
mod encoder;
pub mod graph;
pub mod layers;
pub mod params;
mod registry;
mod rnn;
pub mod seeded;
pub(crate) mod tracer;
mod transformer;

pub use params::{init_std, is_buffer, ParamStore};
pub use registry::{register, registered, registered_for, UserModel};
pub use tracer::{Operand, Record, Tracer};

use crate::spec::{InitSpec, ModelSpec};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

/// A model under test: maps a batch of inputs to outputs (logits).
///
/// Inputs are (batch, ...) in the compute dtype, or u32 token ids of shape
/// (batch, seq_len). Outputs are (batch, outputs), or (batch, seq_len,
/// outputs) for per-token heads.
pub trait Model {
    /// The model's output for `input`, recording its stages into `tracer`.
    fn forward(&self, input: &Tensor, tracer: &mut Tracer) -> Result<Tensor>;
}

/// Builds a model from a `VarBuilder`. The runner calls it once to create the
/// parameters and then once per step; building must only fetch parameters.
///
/// The builder is `'static` (the runner's builders own their store), so a
/// model may keep it or borrow from it: candle-transformers' `resnet18`
/// returns a `Func<'_>` tied to its builder, and is a factory as it is.
///
/// How drivers take a factory, one convention: a driver of the one case
/// its caller holds takes `&dyn ModelFactory` (`run_model`, `diagnose`,
/// `gradcheck::check_model`; a built-in family's is
/// `BuiltinFactory::new(&case.model)`, and `run`/`run_with_options` are its
/// shorthand); a driver of cases it makes or reads itself (minimize's
/// candidates, an LR table's configurations, a differential's arms, a
/// replayed file) takes `Option<&dyn ModelFactory>`, where `None` is each
/// case's built-in family, resolved by [`factory_for`].
pub trait ModelFactory: Sync {
    /// The model, its variables created through `vb`.
    fn build(&self, vb: VarBuilder<'static>) -> Result<Box<dyn Model>>;

    /// Builds the model of the case being run: `spec` is its model field and
    /// `knobs` its declared knobs (`model.knobs`); the runner always calls
    /// this. A factory that reads knobs is a [`WithKnobs`]; a built-in
    /// family's builds `spec`, so a changed case (diagnose's and minimize's
    /// variants) runs its own model.
    fn build_with(
        &self,
        vb: VarBuilder<'static>,
        spec: &ModelSpec,
        knobs: &Knobs,
    ) -> Result<Box<dyn Model>> {
        let _ = (spec, knobs);
        self.build(vb)
    }
}

/// The values of a case's declared model knobs, for a factory to read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Knobs(std::collections::BTreeMap<String, f64>);

impl Knobs {
    /// The knobs a case declares (none for a built-in family).
    pub fn of(spec: &ModelSpec) -> Self {
        Knobs(
            spec.knobs()
                .map(|k| k.iter().map(|(n, k)| (n.clone(), k.value)).collect())
                .unwrap_or_default(),
        )
    }

    /// The knob `name`; an error naming the field when the case does not
    /// declare it.
    pub fn get(&self, name: &str) -> Result<f64> {
        self.0.get(name).copied().ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "the model reads the knob `{name}`, which the case does not declare (model.knobs.{name})"
            ))
        })
    }

    /// The knob `name`, or `default` when the case does not declare it
    /// (the same factory then also serves a plain candle loop).
    pub fn get_or(&self, name: &str, default: f64) -> f64 {
        self.0.get(name).copied().unwrap_or(default)
    }
}

/// A factory that reads the case's knobs:
/// `WithKnobs(|vb, knobs| { let eps = knobs.get("ln_eps")?; ... })`.
pub struct WithKnobs<F>(pub F);

impl<F> ModelFactory for WithKnobs<F>
where
    F: Fn(VarBuilder<'static>, &Knobs) -> Result<Box<dyn Model>> + Sync,
{
    fn build(&self, vb: VarBuilder<'static>) -> Result<Box<dyn Model>> {
        (self.0)(vb, &Knobs::default())
    }

    fn build_with(
        &self,
        vb: VarBuilder<'static>,
        _spec: &ModelSpec,
        knobs: &Knobs,
    ) -> Result<Box<dyn Model>> {
        (self.0)(vb, knobs)
    }
}

/// Any `Fn(VarBuilder) -> Result<Box<dyn Model>>` is a factory.
impl<F> ModelFactory for F
where
    F: Fn(VarBuilder<'static>) -> Result<Box<dyn Model>> + Sync,
{
    fn build(&self, vb: VarBuilder<'static>) -> Result<Box<dyn Model>> {
        self(vb)
    }
}

/// Adapts any candle-nn `Module` (which records nothing) to [`Model`].
pub struct ModuleModel<M>(pub M);

impl<M: candle_nn::Module> Model for ModuleModel<M> {
    fn forward(&self, input: &Tensor, _tracer: &mut Tracer) -> Result<Tensor> {
        self.0.forward(input)
    }
}

/// The factory of a built-in family, from its spec.
pub struct BuiltinFactory {
    spec: ModelSpec,
}

impl BuiltinFactory {
    /// `None` for a `custom` model spec, whose factory the caller provides.
    pub fn new(spec: &ModelSpec) -> Option<Self> {
        match spec {
            ModelSpec::Custom(_) => None,
            other => Some(BuiltinFactory {
                spec: other.clone(),
            }),
        }
    }
}

/// The factory to build a case's model with: the caller's, else the
/// built-in family's (`builtin` is `BuiltinFactory::new(&case.model)`),
/// else the process's registered model's ([`register`]) for a custom case
/// of its name; a `custom` model without a factory is an error naming the
/// field.
pub fn factory_for<'a>(
    case: &crate::spec::Case,
    given: Option<&'a dyn ModelFactory>,
    builtin: &'a Option<BuiltinFactory>,
) -> crate::error::Result<&'a dyn ModelFactory> {
    match (given, builtin, registered_for(case)) {
        (Some(f), _, _) => Ok(f),
        (None, Some(b), _) => Ok(b),
        (None, None, Some(m)) => Ok(&*m.factory),
        (None, None, None) => Err(crate::error::Error::invalid(
            "model.family",
            format!(
                "`{}` is a custom model: run it through the library with its factory",
                case.family()
            ),
        )),
    }
}

impl ModelFactory for BuiltinFactory {
    fn build(&self, vb: VarBuilder<'static>) -> Result<Box<dyn Model>> {
        build_builtin(&self.spec, vb)
    }

    /// The case's own model: a variant that changed a model field (an eps,
    /// a mask) must not run the model this factory was made for.
    fn build_with(
        &self,
        vb: VarBuilder<'static>,
        spec: &ModelSpec,
        _knobs: &Knobs,
    ) -> Result<Box<dyn Model>> {
        match spec {
            ModelSpec::Custom(_) => self.build(vb),
            spec => build_builtin(spec, vb),
        }
    }
}

/// A built-in family's model of `spec`.
fn build_builtin(spec: &ModelSpec, vb: VarBuilder<'static>) -> Result<Box<dyn Model>> {
    Ok(match spec {
        ModelSpec::Cnn(c) => Box::new(cnn::Cnn::new(c, vb)?),
        ModelSpec::Transformer(t) => Box::new(transformer::Transformer::new(t, vb)?),
        ModelSpec::Rnn(r) => Box::new(rnn::Rnn::new(r, vb)?),
        ModelSpec::Decoder(d) => Box::new(decoder::Decoder::new(d, vb)?),
        ModelSpec::Encoder(e) => Box::new(encoder::Encoder::new(e, vb)?),
        ModelSpec::Custom(_) => candle_core::bail!("a custom model needs its own factory"),
    })
}

/// The init hint for a weight with these fans under the case's scheme.
pub(crate) fn weight_init(spec: &InitSpec, fan_in: usize, fan_out: usize) -> candle_nn::Init {
    candle_nn::Init::Randn {
        mean: 0.0,
        stdev: init_std(spec, fan_in, fan_out),
    }
}
