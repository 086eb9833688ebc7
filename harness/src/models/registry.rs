//! The process's own model: a user's binary that runs nanhunt's command
//! line over its model (`nanhunt::cli::main_with`) registers it once, and
//! every place that resolves a case's factory without being given one —
//! the commands, campaign workers (threads and child processes of the same
//! binary), the minimizer, replay — finds it for the custom cases of its
//! name, with its dataset and loss.

use super::ModelFactory;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::losses::UserLoss;
use crate::spec::{Case, ModelSpec};
use std::sync::{Arc, OnceLock};

/// A user's own model as the command line runs it: the case every command
/// starts from (its `custom` model spec, data, loss and defaults), the
/// factory, and the dataset and loss closure the case may name.
pub struct UserModel {
    /// The case every command starts from.
    pub case: Case,
    /// Builds the model.
    pub factory: Box<dyn ModelFactory + Send>,
    /// The dataset a case's `user` source names.
    pub dataset: Option<Arc<dyn Dataset>>,
    /// The loss a case's `custom` loss names.
    pub loss: Option<Arc<dyn UserLoss>>,
}

impl UserModel {
    /// The model of `case` (whose model is `custom`), built by `factory`.
    pub fn new(case: Case, factory: impl ModelFactory + Send + 'static) -> Self {
        UserModel {
            case,
            factory: Box::new(factory),
            dataset: None,
            loss: None,
        }
    }

    /// The dataset of a case whose `data.source` is `user`.
    pub fn with_dataset(mut self, dataset: Arc<dyn Dataset>) -> Self {
        self.dataset = Some(dataset);
        self
    }

    /// The loss of a case whose `loss` is `custom`.
    pub fn with_loss(mut self, loss: Arc<dyn UserLoss>) -> Self {
        self.loss = Some(loss);
        self
    }

    /// The model's name, as its cases and signatures give it.
    pub fn name(&self) -> &str {
        self.case.family()
    }
}

static REGISTERED: OnceLock<UserModel> = OnceLock::new();

/// Makes `model` the process's own model (once per process). Its case
/// must be valid and have a `custom` model.
pub fn register(model: UserModel) -> Result<&'static UserModel> {
    if !matches!(model.case.model, ModelSpec::Custom(_)) {
        return Err(Error::invalid(
            "model.family",
            "a registered model's case has a `custom` model",
        ));
    }
    model.case.validate(&crate::spec::Limits::default())?;
    let name = model.name().to_string();
    let mut fresh = false;
    let registered = REGISTERED.get_or_init(|| {
        fresh = true;
        model
    });
    if !fresh && registered.name() != name {
        return Err(Error::option(
            "model",
            format!(
                "`{}` is already this process's model; `{name}` cannot be registered too",
                registered.name()
            ),
        ));
    }
    Ok(registered)
}

/// The process's own model, if one was registered.
pub fn registered() -> Option<&'static UserModel> {
    REGISTERED.get()
}

/// The registered model that builds `case`: a `custom` case of its name.
pub fn registered_for(case: &Case) -> Option<&'static UserModel> {
    let m = registered()?;
    (matches!(case.model, ModelSpec::Custom(_)) && case.family() == m.name()).then_some(m)
}
