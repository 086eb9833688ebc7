//! A user's own candle model with a numerically unsafe op, run through
//! nanhunt's `run` and `diagnose` by the library API: the finding's
//! explanation names the pattern at the stage, and diagnose verifies it by
//! intervention before it ranks the code's cause first.
//!
//! The model normalizes each sample by its RMS without an epsilon:
//! `x / sqrt(mean(x²))`, which is 0/0 for an all-zero sample. Some data
//! pipelines produce such samples (padding, failed decodes); here the case
//! injects them from step 5 on.
//!
//! Run: `cargo run -p nanhunt --example user_model`

use candle_core::{Module, Tensor, D};
use candle_nn::{linear, Linear, VarBuilder};
use nanhunt::diagnose::diagnose;
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::{Case, CustomSpec, InputSpec, ModelSpec, Pathology};
use nanhunt::{Outcome, RunOptions};

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
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        // The unsafe op: no eps under the square root.
        let rms = x.sqr()?.mean_keepdim(D::Minus1)?.sqrt()?;
        let x = tr.record("rms_norm", x.broadcast_div(&rms)?)?;
        let h = tr.record("hidden", self.hidden.forward(&x)?.relu()?)?;
        tr.record("head", self.head.forward(&h)?)
    }
}

fn main() -> anyhow::Result<()> {
    let mut case = Case::example("cnn").expect("built-in example");
    case.model = ModelSpec::Custom(CustomSpec::new(
        "rms_mlp",
        InputSpec::Vector { features: 16 },
        4,
    ));
    case.steps = 30;
    case.data.pathologies = vec![Pathology::AllZero {
        fraction: 0.05,
        from_step: 5,
    }];
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(RmsNormMlp::new(vb)?))
    };

    // 1. Run it: the probe catches the first NaN, names its producer and
    //    explains what the stage did.
    match nanhunt::run_model(&case, &factory, &RunOptions::default())? {
        Outcome::Unstable { finding } => {
            println!(
                "run: {} at step {}\n     {}",
                finding.signature, finding.step, finding.detail
            );
            if let Some(e) = &finding.explanation {
                println!(
                    "     explanation: {}\n     repair: {}",
                    e.sentence, e.repair
                );
            }
        }
        other => println!("run: {}", other.verdict()),
    }

    // 2. Diagnose it: evidence, ranked causes and verified fixes. The code's
    //    own cause is verified by an intervention: the same run with the
    //    stage guarded through the tracer, no edit to the model.
    let d = diagnose(&case, &factory, &RunOptions::default())?;
    if let Some(scan) = &d.batch_raw {
        println!("data at the failing step: {}", scan.findings().join("; "));
    }
    for (i, c) in d.causes.iter().enumerate().take(3) {
        println!("{}. {} (verified fix: {})", i + 1, c.title, c.verified());
        for f in &c.fixes {
            let how = if f.intervention.is_some() {
                "intervention"
            } else {
                "fix"
            };
            println!("   {how}: {} -> {}", f.description, f.result);
        }
    }
    Ok(())
}
