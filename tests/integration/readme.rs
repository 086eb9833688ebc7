//! The README's Rust, compiled: every ```rust block of README.md and of the
//! reference pages under `docs/` (`support::USER_PAGES`) appears here
//! verbatim between `// readme:begin` and `// readme:end`, inside a
//! function that gives it what it needs, so a change of the public API that
//! breaks the code users copy from the pages breaks this build; and a test
//! checks that the pages' blocks and this file's still agree, each once.
//! (The examples in `harness/examples/` are built by `cargo test` too.)

#![allow(dead_code, unused_variables, clippy::all)]

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use nanhunt::models::Model;
use nanhunt::spec::{Case, OptimizerSpec};
use nanhunt::RunOptions;

/// The blocks of README.md, in order, each without its fence.
fn readme_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```rust") => current = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            (Some(lines), _) => lines.push(line),
            (None, _) => {}
        }
    }
    blocks
}

/// The regions of this file between the markers, dedented.
fn compiled_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        match (&mut current, line.trim()) {
            (None, "// readme:begin") => current = Some(Vec::new()),
            (Some(lines), "// readme:end") => {
                let indent = lines
                    .iter()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| l.len() - l.trim_start().len())
                    .min()
                    .unwrap_or(0);
                let dedented: Vec<&str> = lines
                    .iter()
                    .map(|l| {
                        if l.len() >= indent {
                            &l[indent..]
                        } else {
                            l.trim()
                        }
                    })
                    .collect();
                blocks.push(dedented.join("\n"));
                current = None;
            }
            (Some(lines), _) => lines.push(line),
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_rust_block_of_the_readme_is_compiled_here() {
    let pages = crate::support::user_pages();
    let this = include_str!("readme.rs");
    let mut shown: Vec<(String, &str)> = pages
        .iter()
        .flat_map(|(page, text)| readme_blocks(text).into_iter().map(move |b| (b, *page)))
        .collect();
    let in_readme = shown.iter().filter(|(_, p)| *p == "README.md").count();
    assert!(in_readme >= 4, "the README's Rust blocks: {in_readme}");
    let mut compiled = compiled_blocks(this);
    shown.sort();
    compiled.sort();
    let blocks: Vec<&String> = shown.iter().map(|(b, _)| b).collect();
    for (b, page) in &shown {
        assert!(
            compiled.contains(b),
            "a Rust block of {page} has no compiled copy here:\n{b}"
        );
    }
    for c in &compiled {
        assert!(
            blocks.contains(&c),
            "a compiled copy here is on no page:\n{c}"
        );
    }
    assert_eq!(
        blocks.len(),
        compiled.len(),
        "every block once on the pages, and its copy once here"
    );
}

/// A user's model and its factory, for the blocks that take one.
fn my_factory(vb: VarBuilder<'static>) -> candle_core::Result<Box<dyn Model>> {
    let l1 = candle_nn::linear(8, 4, vb.pp("l1"))?;
    Ok(Box::new(nanhunt::models::ModuleModel(l1)))
}

#[rustfmt::skip]
fn user_report() -> anyhow::Result<()> {
    use nanhunt::campaign::UserCampaign;
    let case = Case::example("cnn").unwrap();
    // readme:begin
    let report = nanhunt::campaign::user_report(&case, &my_factory, &UserCampaign::new(16, 0))?;
    insta::assert_snapshot!(report.to_markdown());
    // readme:end
    Ok(())
}

#[rustfmt::skip]
#[allow(unnameable_test_items)]
fn regression_suite() {
    // readme:begin
    #[test]
    fn stability_regressions() {
        nanhunt::regression::assert_dir_reproduces("corpora/repro".as_ref(), None);
    }
    // readme:end
}

struct Net(candle_nn::Linear);

impl Net {
    fn loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let logits = candle_core::Module::forward(&self.0, x)?;
        candle_nn::loss::mse(&logits, y)
    }
}

#[rustfmt::skip]
fn guarded_loop() -> anyhow::Result<()> {
    let varmap = VarMap::new();
    let model = Net(candle_nn::linear(8, 4, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?);
    let (x, y) = (Tensor::zeros((2, 8), DType::F32, &Device::Cpu)?, Tensor::zeros((2, 4), DType::F32, &Device::Cpu)?);
    let steps = 3;
    // readme:begin
    use nanhunt::guard::{Batch, Guard, GuardOptions};

    let mut guard = Guard::new(&varmap, GuardOptions::default().dump_to("nan-scene"))?;
    let mut opt = guard.optimizer(OptimizerSpec::Adamw { lr: 3e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 })?;
    for step in 0..steps {
        let batch = Batch::new([("x", x.clone()), ("y", y.clone())]);
        guard.step(step, &batch, &mut opt, |b| model.loss(b.get("x")?, b.get("y")?))?;
    }
    guard.finish(&opt)?; // a finite explosion, or a divergence not yet judged, at the loop's end
    // readme:end
    Ok(())
}

#[rustfmt::skip]
fn seeded_model() -> anyhow::Result<()> {
    let x = Tensor::zeros((2, 8), DType::F32, &Device::Cpu)?;
    // readme:begin
    use candle_nn::Module;
    use nanhunt::models::seeded;

    let varmap = VarMap::new();
    let vb = seeded::var_builder(&varmap, 42, DType::F32, &Device::Cpu);
    let l1 = candle_nn::linear(8, 16, vb.pp("l1"))?;
    let dropout = seeded::Dropout::new(0.1, 42, "l1.dropout");
    let h = dropout.forward_t(&l1.forward(&x)?, true)?;
    // readme:end
    Ok(())
}

fn config() -> candle_transformers::models::llama::Config {
    candle_transformers::models::llama::Config {
        hidden_size: 16,
        intermediate_size: 32,
        vocab_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 2,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 32,
        tie_word_embeddings: false,
    }
}

/// The model of the README's `main_with` example.
struct MyModel(candle_nn::Linear);
impl MyModel {
    fn new(vb: candle_nn::VarBuilder) -> candle_core::Result<Self> {
        Ok(MyModel(candle_nn::linear(16, 4, vb)?))
    }
}
impl Model for MyModel {
    fn forward(&self, x: &Tensor, _: &mut nanhunt::models::Tracer) -> candle_core::Result<Tensor> {
        candle_core::Module::forward(&self.0, x)
    }
}

#[rustfmt::skip]
fn own_binary() {
    // readme:begin
    // examples/my_model.rs
    use nanhunt::models::{Model, UserModel};
    use nanhunt::spec::{Case, CustomSpec, InputSpec, ModelSpec};

    fn main() {
        let mut case = Case::example("cnn").unwrap();
        case.model = ModelSpec::Custom(CustomSpec::new("my_model", InputSpec::Vector { features: 16 }, 4));
        let factory = |vb: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn Model>> {
            Ok(Box::new(MyModel::new(vb)?))
        };
        nanhunt::cli::main_with(UserModel::new(case, factory))
    }
    // readme:end
}

#[rustfmt::skip]
mod instrumented_model {
    // readme:begin
    use candle_core::{Module, Tensor, D};
    use nanhunt::models::{Model, Tracer};

    struct MyModel {
        hidden: candle_nn::Linear,
        head: candle_nn::Linear,
    }

    impl Model for MyModel {
        #[nanhunt::instrument]
        fn forward(&self, x: &Tensor, _: &mut Tracer) -> candle_core::Result<Tensor> {
            let rms = x.sqr()?.mean_keepdim(D::Minus1)?.sqrt()?;
            let h = self.hidden.forward(&x.broadcast_div(&rms)?)?.relu()?;
            self.head.forward(&h)
        }
    }
    // readme:end
}

#[rustfmt::skip]
fn transformers_model() -> anyhow::Result<()> {
    let case = Case::example("cnn").unwrap();
    // readme:begin
    use candle_transformers::models::llama;
    use nanhunt::models::{Model, Tracer};

    struct Llama(llama::Llama, candle_core::DType);
    impl Model for Llama {
        fn forward(&self, ids: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
            let mut cache = llama::Cache::new(false, self.1, &config(), ids.device())?;
            tr.record("llama", self.0.forward(ids, 0, &mut cache)?)
        }
    }
    let factory = |vb: VarBuilder<'static>| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(Llama(llama::Llama::load(vb.clone(), &config())?, vb.dtype())))
    };
    // case.model = {"family": "custom", "name": "llama", "input": {"kind": "tokens", …}, "outputs": 64}
    let outcome = nanhunt::run_model(&case, &factory, &RunOptions::default())?;
    let report = nanhunt::gradcheck::check_model(&case, &factory)?;
    let diagnosis = nanhunt::diagnose::diagnose(&case, &factory, &RunOptions::default())?;
    // readme:end
    Ok(())
}

#[rustfmt::skip]
fn plain_model() -> anyhow::Result<()> {
    // readme:begin
    use nanhunt::models::{Model, ModuleModel};
    use nanhunt::spec::{Case, CustomSpec, InputSpec, ModelSpec};

    let mut case = Case::example("cnn").unwrap();
    case.model = ModelSpec::Custom(CustomSpec::new("my_mlp", InputSpec::Vector { features: 8 }, 4));
    let factory = |vb: candle_nn::VarBuilder| -> candle_core::Result<Box<dyn Model>> {
        let l1 = candle_nn::linear(8, 16, vb.pp("l1"))?;
        let l2 = candle_nn::linear(16, 4, vb.pp("l2"))?;
        Ok(Box::new(ModuleModel(candle_nn::seq().add(l1).add(candle_nn::Activation::Relu).add(l2))))
    };
    let outcome = nanhunt::run_model(&case, &factory, &nanhunt::RunOptions::default())?;
    // readme:end
    Ok(())
}
