//! Bert from candle-transformers with every function
//! instrumented (scripts/instrument-candle-transformers.py): its forward
//! pass traced and untraced must give the same bits, and record its ops.
use candle::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::bert;

fn main() -> anyhow::Result<()> {
    let mut cfg = bert::Config::default();
    cfg.hidden_size = 32; cfg.intermediate_size = 64; cfg.num_hidden_layers = 2; cfg.num_attention_heads = 4; cfg.vocab_size = 100;
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let model = bert::BertModel::load(vb, &cfg)?;
    let ids = Tensor::new(&[[1u32, 5, 9, 3], [2, 7, 0, 0]], &Device::Cpu)?;
    let tt = ids.zeros_like()?;
    let mask = Tensor::new(&[[1u32, 1, 1, 1], [1, 1, 0, 0]], &Device::Cpu)?;
    let run = || model.forward(&ids, &tt, Some(&mask));
    let plain = run()?;
    let (traced, tracer) = nanhunt::traced(run);
    let traced = traced?;
    let a: Vec<f32> = plain.flatten_all()?.to_vec1()?;
    let b: Vec<f32> = traced.flatten_all()?.to_vec1()?;
    let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
    println!("same bits: {same} ({} records)", tracer.records().len());
    assert!(same, "a traced forward pass changed the bits");
    assert!(tracer.records().len() > 50, "its ops are recorded");
    Ok(())
}
