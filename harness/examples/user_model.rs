//! A user's own candle model with a latent NaN, given nanhunt's whole
//! command line by one call: every subcommand runs this model, its case the
//! default (`cargo run -p nanhunt --example user_model -- run`, `-- hunt`,
//! `-- fuzz --runs 50`, `-- diagnose`, `-- replay DIR`, `-- lr-table`, ...).
//!
//! The model normalizes each sample by its RMS without an epsilon:
//! `x / sqrt(mean(x²))`, which is 0/0 for an all-zero sample. Its training
//! data has none, so `run` is stable and the bug stays hidden; `hunt` finds
//! the input that fires it and writes a reproducer, and `fuzz` finds it
//! through the data pathologies it draws (padding, failed decodes).
//!
//! `#[nanhunt::instrument]` on `forward` is all the model declares: every
//! tensor op in it is seen with its line, so a finding names the division
//! and its line, and the hunt searches every op with an unsafe domain.

use candle_core::{Module, Tensor, D};
use candle_nn::{linear, Linear, VarBuilder};
use nanhunt::models::{Model, Tracer, UserModel};
use nanhunt::spec::{Case, CustomSpec, InputSpec, ModelSpec};

struct RmsNormMlp {
    hidden: Linear,
    head: Linear,
}

impl RmsNormMlp {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(RmsNormMlp {
            hidden: linear(16, 32, vb.pp("hidden"))?,
            head: linear(32, 4, vb.pp("head"))?,
        })
    }
}

impl Model for RmsNormMlp {
    #[nanhunt::instrument]
    fn forward(&self, x: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
        // The unsafe op: no eps under the square root.
        let rms = x.sqr()?.mean_keepdim(D::Minus1)?.sqrt()?;
        let x = x.broadcast_div(&rms)?;
        let h = self.hidden.forward(&x)?.relu()?;
        self.head.forward(&h)
    }
}

/// The model's case: what every command runs when no case file is given.
fn case() -> Case {
    let mut case = Case::example("cnn").expect("built-in example");
    case.model = ModelSpec::Custom(CustomSpec::new(
        "rms_mlp",
        InputSpec::Vector { features: 16 },
        4,
    ));
    case.steps = 30;
    case
}

fn main() {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(RmsNormMlp::new(vb)?))
    };
    nanhunt::cli::main_with(UserModel::new(case(), factory))
}
