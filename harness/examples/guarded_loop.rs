//! A complete candle training loop — a VarMap, an MLP, nanhunt's AdamW as a
//! `candle_nn::Optimizer`, batches of the shipped 8×8 digits — guarded by
//! nanhunt with the lines marked `// guard`. With `--nan` a NaN is planted
//! in the batch of step 30: the guard stops the loop there, names
//! `batch.x`, writes the scene to `guard-scene/` and replays it.
//!
//! `cargo run --release -p nanhunt --example guarded_loop [-- --nan]`

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{linear, Linear, Optimizer, VarBuilder, VarMap};
use nanhunt::guard::{Batch, Guard, GuardOptions};
use nanhunt::spec::{FileSource, OptimizerSpec};

struct Mlp {
    l1: Linear,
    l2: Linear,
}

impl Mlp {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Mlp {
            l1: linear(64, 32, vb.pp("l1"))?,
            l2: linear(32, 10, vb.pp("l2"))?,
        })
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let h = nanhunt::trace("l1", self.l1.forward(x)?)?.relu()?;
        let logits = nanhunt::trace("l2", self.l2.forward(&h)?)?;
        candle_nn::loss::cross_entropy(&logits, y)
    }
}

fn main() -> anyhow::Result<()> {
    let plant = std::env::args().any(|a| a == "--nan");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let digits = nanhunt::data::files::load(
        &FileSource::new(root.join("corpora/datasets/digits/digits.safetensors")),
        1 << 30,
    )?;
    let (n, dev) = (digits.labels.len(), Device::Cpu);
    let x_all = (Tensor::from_slice(&digits.values, (n, 64), &dev)? / 16.0)?;
    let y_all = Tensor::from_slice(&digits.labels, n, &dev)?.to_dtype(DType::U32)?;

    let varmap = VarMap::new();
    let model = Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    let scene = std::path::PathBuf::from("guard-scene");
    let _ = std::fs::remove_dir_all(&scene);
    let mut guard = Guard::new(&varmap, GuardOptions::default().dump_to(&scene))?; // guard
    let mut opt = guard.optimizer(OptimizerSpec::Adamw {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    })?; // guard (was candle_nn::AdamW::new)
    for step in 0..60 {
        let start = (step * 64) % (n - 64);
        let mut x = x_all.narrow(0, start, 64)?;
        if plant && step == 30 {
            let nan = Tensor::full(f32::NAN, (1, 64), &dev)?;
            x = Tensor::cat(&[&x.narrow(0, 0, 63)?, &nan], 0)?;
        }
        let y = y_all.narrow(0, start, 64)?;
        let batch = Batch::new([("x", x), ("y", y)]); // guard
        let loss = match guard.step(step, &batch, &mut opt, |b| {
            model.loss(b.get("x")?, b.get("y")?)
        }) {
            // guard (was opt.backward_step)
            Ok(loss) => loss,
            Err(e) => {
                eprintln!("stopped: {e}");
                let r = nanhunt::guard::replay(&scene, &varmap, |b| {
                    model.loss(b.get("x")?, b.get("y")?)
                })?;
                eprintln!("replay: {}", r.message);
                return Ok(());
            }
        };
        if step % 10 == 0 {
            println!(
                "step {step:>2}: loss {loss:.4} (lr {})",
                opt.learning_rate()
            );
        }
    }
    Ok(())
}
