//! A stability report for a user's own model, ready for
//! `insta::assert_snapshot!(report.to_markdown())` in a test suite.
//!
//! Run: `cargo run -p nanhunt --example user_report`

use candle_nn::VarBuilder;
use nanhunt::campaign::{user_report, UserCampaign};
use nanhunt::models::{Model, ModuleModel};
use nanhunt::spec::{Case, CustomSpec, InputSpec, LossSpec, ModelSpec};

fn my_model(vb: VarBuilder) -> candle_core::Result<Box<dyn Model>> {
    let l1 = candle_nn::linear(8, 16, vb.pp("l1"))?;
    let l2 = candle_nn::linear(16, 4, vb.pp("l2"))?;
    Ok(Box::new(ModuleModel(
        candle_nn::seq()
            .add(l1)
            .add(candle_nn::Activation::Relu)
            .add(l2),
    )))
}

fn main() -> anyhow::Result<()> {
    let mut case = Case::example("cnn").expect("built-in example");
    case.model = ModelSpec::Custom(CustomSpec::new(
        "my_mlp",
        InputSpec::Vector { features: 8 },
        4,
    ));
    case.loss = LossSpec::CrossEntropy {
        label_smoothing: 0.0,
    };
    // 16 seeded variations of the case (learning rate, precision, data seed,
    // steps, input scale, clipping, batch size), all with the user's model.
    let report = user_report(&case, &my_model, &UserCampaign::new(16, 0))?;
    // In a test: insta::assert_snapshot!(report.to_markdown());
    print!("{}", report.to_markdown());
    Ok(())
}
