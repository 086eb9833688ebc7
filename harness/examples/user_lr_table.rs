//! A learning-rate table for a user's own model family: a small MLP written
//! against candle-nn's `VarBuilder`, measured with SGD, momentum and Adam.
//!
//! Run: `cargo run --release -p nanhunt --example user_lr_table`

use candle_core::{Module, Tensor};
use candle_nn::{linear, Linear, VarBuilder};
use nanhunt::lrtable::{measure, optimizer_named, Config, LrTableOptions};
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::{Case, CustomSpec, InputSpec, ModelSpec};

struct Mlp {
    hidden: Linear,
    head: Linear,
}

impl Model for Mlp {
    fn forward(&self, x: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let h = tr.record("hidden", self.hidden.forward(x)?.relu()?)?;
        tr.record("head", self.head.forward(&h)?)
    }
}

fn main() -> anyhow::Result<()> {
    let factory = |vb: VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(Mlp {
            hidden: linear(16, 64, vb.pp("hidden"))?,
            head: linear(64, 4, vb.pp("head"))?,
        }))
    };
    let mut base = Case::example("cnn").expect("built-in example");
    base.model = ModelSpec::Custom(CustomSpec::new(
        "mlp",
        InputSpec::Vector { features: 16 },
        4,
    ));
    let configs: Vec<Config> = ["sgd", "momentum", "adam"]
        .into_iter()
        .map(|name| {
            let mut case = base.clone();
            case.optimizer = optimizer_named(name).expect("a known optimizer");
            Config {
                family: "mlp".into(),
                size: "16-64-4".into(),
                optimizer: name.into(),
                case,
            }
        })
        .collect();
    let mut opts = LrTableOptions::default();
    opts.jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    opts.progress = Some(std::sync::Arc::new(SeedsDone));
    let table = measure(&configs, Some(&factory), &opts)?;
    print!("{}", table.to_markdown());
    Ok(())
}

/// Progress as a line on stderr per measured seed (any `Progress` will do).
#[derive(Debug)]
struct SeedsDone;

impl nanhunt::progress::Progress for SeedsDone {
    fn update(&self, done: u64, status: &str) {
        eprintln!("{done} seeds measured {status}");
    }
}
