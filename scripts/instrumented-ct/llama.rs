//! Llama from candle-transformers with every function
//! instrumented (scripts/instrument-candle-transformers.py): its forward
//! pass traced and untraced must give the same bits, and record its ops.
use candle::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::llama;

fn main() -> anyhow::Result<()> {
    let cfg = llama::Config {
        hidden_size: 16, intermediate_size: 32, vocab_size: 64, num_hidden_layers: 2,
        num_attention_heads: 2, num_key_value_heads: 2, use_flash_attn: false, rms_norm_eps: 1e-5,
        rope_theta: 10_000.0, bos_token_id: None, eos_token_id: None, rope_scaling: None,
        max_position_embeddings: 32, tie_word_embeddings: false,
    };
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let model = llama::Llama::load(vb, &cfg)?;
    let ids = Tensor::new(&[[1u32, 5, 9, 3]], &Device::Cpu)?;
    let run = || -> candle::Result<Tensor> {
        let mut cache = llama::Cache::new(false, DType::F32, &cfg, &Device::Cpu)?;
        model.forward(&ids, 0, &mut cache)
    };
    let plain = run()?;
    let (traced, tracer) = nanhunt::traced(run);
    let traced = traced?;
    let a: Vec<f32> = plain.flatten_all()?.to_vec1()?;
    let b: Vec<f32> = traced.flatten_all()?.to_vec1()?;
    let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
    println!("same bits: {same}");
    assert!(same, "a traced forward pass changed the bits");
    let recs = tracer.records();
    println!("{} records", recs.len());
    assert!(recs.len() > 50, "its ops are recorded");
    Ok(())
}
