//! candle-transformers' Llama, as published, through nanhunt: `run` reports
//! the tensors its fused ops leave without a gradient, `gradcheck` checks
//! the rest (in f32: the fused ops have no f64 kernels), `diagnose` ranks
//! the cut first, and declaring the unreached part frozen trains the rest.
//!
//! Run: `cargo run -p nanhunt --example transformers_llama`

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama;
use nanhunt::models::{Model, Tracer};
use nanhunt::spec::{Case, CustomSpec, InputSpec, ModelSpec, Precision};
use nanhunt::RunOptions;

/// A tiny Llama: hidden 32, 2 layers, 4 heads over 2 key/value heads.
fn config() -> llama::Config {
    llama::Config {
        hidden_size: 32,
        intermediate_size: 64,
        vocab_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 4,
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

/// The model predicts the token after the sequence (its own head).
struct Llama {
    inner: llama::Llama,
    dtype: DType,
}

impl Model for Llama {
    fn forward(&self, ids: &Tensor, tr: &mut Tracer) -> candle_core::Result<Tensor> {
        let mut cache = llama::Cache::new(false, self.dtype, &config(), ids.device())?;
        tr.record("llama", self.inner.forward(ids, 0, &mut cache)?)
    }
}

fn main() -> anyhow::Result<()> {
    let mut case = Case::example("transformer").expect("built-in example");
    case.model = ModelSpec::Custom(CustomSpec::new(
        "llama",
        InputSpec::Tokens {
            seq_len: 8,
            vocab: 64,
        },
        64,
    ));
    case.precision = Precision::F32;
    case.steps = 10;
    let factory = |vb: VarBuilder<'static>| -> candle_core::Result<Box<dyn Model>> {
        Ok(Box::new(Llama {
            dtype: vb.dtype(),
            inner: llama::Llama::load(vb, &config())?,
        }))
    };

    // 1. Run it: a plain candle loop would train 1 of its 21 tensors and
    //    say nothing; nanhunt stops at step 0 with a no_gradient finding.
    let outcome = nanhunt::run_model(&case, &factory, &RunOptions::default())?;
    let finding = outcome.finding().expect("the fused ops cut the gradient");
    println!("run: {}\n     {}\n", finding.signature, finding.detail);

    // 2. Check the gradients it does compute.
    let report = nanhunt::gradcheck::check_model(&case, &factory)?;
    println!(
        "gradcheck in {:?} ({}): {} tensors checked, {} without a gradient, passed: {}\n",
        report.precision,
        report.fallback.as_deref().unwrap_or("f64"),
        report.tensors.iter().filter(|t| t.has_gradient).count(),
        report.coverage.as_ref().map_or(0, |c| c.frozen_tensors),
        report
            .tensors
            .iter()
            .filter(|t| t.has_gradient)
            .all(|t| t.passed)
    );

    // 3. Diagnose it: the cut ranks first.
    let d = nanhunt::diagnose::diagnose(&case, &factory, &RunOptions::default())?;
    for (i, c) in d.causes.iter().enumerate().take(2) {
        println!("{}. {} (verified fix: {})", i + 1, c.title, c.verified());
    }

    // 4. Train what the gradient reaches, on purpose: declare the rest frozen.
    if let ModelSpec::Custom(c) = &mut case.model {
        c.frozen = vec!["model".into()];
    }
    let outcome = nanhunt::run_model(&case, &factory, &RunOptions::default())?;
    println!("\nwith `model.*` declared frozen: {}", outcome.verdict());
    Ok(())
}
