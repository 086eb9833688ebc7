//! Replay of a model that draws random numbers: with candle's dropout the
//! scene records that two runs of the step's loss differ, and replay says
//! "not bit-identical: the model draws random numbers" (its verdict and
//! message agree); with nanhunt's seeded dropout and seeded variables the
//! loop and its replay are bit for bit.

use crate::support::*;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{linear, Linear, VarBuilder, VarMap};
use nanhunt::guard::{Batch, Guard, GuardError, GuardOptions};
use nanhunt::models::seeded;
use nanhunt::rng::Rng;
use nanhunt::spec::OptimizerSpec;
use nanhunt::{FindingKind, Phase};

enum Drop {
    Candle(candle_nn::Dropout),
    Seeded(seeded::Dropout),
}

/// x → linear → dropout → relu → sqrt → linear: the square root of the
/// relu's exact zeros has an infinite slope (NaN in the gradient once the
/// relu's zero slope multiplies it), a backward failure at step 0 whose
/// (finite) loss depends on the dropout mask.
struct Net {
    l1: Linear,
    l2: Linear,
    drop: Drop,
}

impl Net {
    fn new(vb: VarBuilder, drop: Drop) -> Net {
        Net {
            l1: linear(8, 16, vb.pp("l1")).unwrap(),
            l2: linear(16, 4, vb.pp("l2")).unwrap(),
            drop,
        }
    }

    fn loss(&self, b: &Batch) -> candle_core::Result<Tensor> {
        let h = self.l1.forward(b.get("x")?)?;
        let h = match &self.drop {
            Drop::Candle(d) => d.forward(&h, true)?,
            Drop::Seeded(d) => d.forward_t(&h, true)?,
        };
        let h = nanhunt::trace("root", h.relu()?.sqrt()?)?;
        let out = self.l2.forward(&h)?;
        candle_nn::loss::mse(&out, b.get("y")?)
    }
}

fn batch() -> Batch {
    let mut rng = Rng::keyed(5, "randomness.test", 0);
    let x: Vec<f32> = (0..16 * 8)
        .map(|_| rng.uniform_in(-1.0, 1.0) as f32)
        .collect();
    Batch::new([
        ("x", Tensor::from_vec(x, (16, 8), &Device::Cpu).unwrap()),
        (
            "y",
            Tensor::zeros((16, 4), DType::F32, &Device::Cpu).unwrap(),
        ),
    ])
}

/// A guarded loop of 5 steps that stops at the first finding; its losses,
/// its finding, and the scene in `dir`.
fn guarded(net: &Net, varmap: &VarMap, dir: &std::path::Path) -> nanhunt::Finding {
    let opts = GuardOptions::default().named("dropout_net").dump_to(dir);
    let mut guard = Guard::new(varmap, opts).unwrap();
    let mut opt = guard
        .optimizer(OptimizerSpec::Sgd {
            lr: 1e-2,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        })
        .unwrap();
    let b = batch();
    for step in 0..5 {
        match guard.step(step, &b, &mut opt, |b| net.loss(b)) {
            Ok(_) => {}
            Err(GuardError::Unstable { finding, .. }) => return *finding,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("expected a finding");
}

fn scene_deterministic(dir: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("scene.json")).unwrap();
    let scene: serde_json::Value = serde_json::from_str(&text).unwrap();
    scene["deterministic"].clone()
}

#[test]
fn candle_dropout_is_recorded_and_replay_says_the_model_draws_random_numbers() {
    let varmap = VarMap::new();
    let vb = seeded::var_builder(&varmap, 1, DType::F32, &Device::Cpu);
    let net = Net::new(vb, Drop::Candle(candle_nn::Dropout::new(0.5)));
    let dir_root = scratch("random-candle");
    let dir = dir_root.join("scene");
    let f = guarded(&net, &varmap, &dir);
    assert_eq!(
        (f.kind, f.phase),
        (FindingKind::Nan, Phase::Backward),
        "{f:?}"
    );
    assert_eq!(scene_deterministic(&dir), serde_json::json!(false));
    let r = nanhunt::guard::replay(&dir, &varmap, |b| net.loss(b)).unwrap();
    assert_eq!(r.bit_identical, Some(false), "{}", r.message);
    assert!(!r.reproduced());
    assert!(
        r.message
            .starts_with("not bit-identical: the model draws random numbers"),
        "{}",
        r.message
    );
}

#[test]
fn seeded_dropout_and_seeded_variables_replay_bit_for_bit() {
    let build = || {
        let varmap = VarMap::new();
        let vb = seeded::var_builder(&varmap, 1, DType::F32, &Device::Cpu);
        let net = Net::new(vb, Drop::Seeded(seeded::Dropout::new(0.5, 1, "l1.dropout")));
        (varmap, net)
    };
    let (varmap, net) = build();
    let dir_root = scratch("random-seeded");
    let dir = dir_root.join("scene");
    let f = guarded(&net, &varmap, &dir);
    assert_eq!(
        (f.kind, f.phase),
        (FindingKind::Nan, Phase::Backward),
        "{f:?}"
    );
    assert_eq!(scene_deterministic(&dir), serde_json::json!(true));
    // A second loop over a fresh build finds the same, bit for bit.
    let (varmap2, net2) = build();
    let again_root = scratch("random-seeded-2");
    let again = guarded(&net2, &varmap2, &again_root.join("scene"));
    assert_eq!((again.step, &again.signature), (f.step, &f.signature));
    let bits = |f: &nanhunt::Finding| {
        f.trace
            .losses
            .iter()
            .map(|l| l.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&again), bits(&f));
    // The replay with a fresh build draws the same mask.
    let (varmap3, net3) = build();
    let r = nanhunt::guard::replay(&dir, &varmap3, |b| net3.loss(b)).unwrap();
    assert!(r.reproduced(), "{}", r.message);
    assert_eq!(r.bit_identical, Some(true));
}
