//! Crash dumps: written atomically, loadable by Python's `safetensors`, and
//! replayed bit for bit from the saved state; reproducers replayed from scratch.

use crate::support::*;
use nanhunt::repro::{Expected, Provenance, Reproducer, REPRO_FORMAT};
use nanhunt::scene::{OptimizerRecord, SavedScene};
use nanhunt::spec::*;

/// Adam with lr 2 on the default CNN: diverges at step 21, after Adam's
/// moments and the divergence tracker have state worth restoring.
fn diverging_case() -> Case {
    let mut c = Case::example("cnn").unwrap();
    c.optimizer = OptimizerSpec::Adam {
        lr: 2.0,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    c
}

fn write_case(dir: &std::path::Path, name: &str, case: &Case) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, case.to_json()).unwrap();
    path
}

/// Runs the diverging case with `--dump DIR/scene`; returns (DIR, the dump).
fn dump_diverging(name: &str) -> (crate::support::Scratch, std::path::PathBuf) {
    let dir = scratch(name);
    let case = write_case(&dir, "case.json", &diverging_case());
    let dump = dir.join("scene");
    let out = nanhunt(&[
        "run",
        case.to_str().unwrap(),
        "--dump",
        dump.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    (dir, dump)
}

#[test]
fn a_dump_replays_bit_for_bit_from_its_saved_state() {
    let (dir, dump) = dump_diverging("dump-replay");
    for file in ["case.json", "scene.safetensors", "scene.json"] {
        assert!(dump.join(file).is_file(), "{file} missing");
    }
    // Nothing but the dump itself is left behind (the temp dir was renamed).
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries.len(), 2, "{entries:?}");

    let loaded = SavedScene::load(&dump).unwrap();
    assert_eq!(loaded.scene.step, 21);
    assert_eq!(loaded.scene.recent_losses.len(), 20);
    assert!(loaded
        .tensors
        .contains_key("optimizer/m.block0.conv.weight"));
    assert!(loaded.tensors.contains_key("batch/inputs"));
    assert!(
        matches!(
            loaded.scene.optimizer,
            OptimizerRecord::Saved { steps: 21, .. }
        ),
        "{:?}",
        loaded.scene.optimizer
    );

    let out = nanhunt(&["replay", dump.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("reproduced: divergence in update"), "{text}");
    assert!(text.contains("bit-identical"), "{text}");
}

#[test]
fn a_dump_never_overwrites_an_existing_directory() {
    let dir = scratch("dump-exists");
    let case = write_case(&dir, "case.json", &diverging_case());
    let existing = dir.join("scene");
    std::fs::create_dir(&existing).unwrap();
    std::fs::write(existing.join("notes.txt"), "keep me").unwrap();
    let out = nanhunt(&[
        "run",
        case.to_str().unwrap(),
        "--dump",
        existing.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(existing.join("notes.txt")).unwrap(),
        "keep me"
    );
}

#[test]
fn pythons_safetensors_loads_the_state() {
    let dir = scratch("dump-python");
    let mut c = Case::example("rnn").unwrap();
    c.data.pathologies = vec![Pathology::Nan {
        fraction: 0.01,
        from_step: 2,
    }];
    let case = write_case(&dir, "case.json", &c);
    let dump = dir.join("scene");
    let out = nanhunt(&[
        "run",
        case.to_str().unwrap(),
        "--dump",
        dump.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let script = r#"
import json, sys
from safetensors.numpy import load_file
state = load_file(sys.argv[1] + "/scene.safetensors")
stats = json.load(open(sys.argv[1] + "/scene.json"))
for name, t in sorted(state.items()):
    assert list(t.shape) == stats["tensors"][name]["shape"], name
x = state["batch/inputs"]
print("inputs", x.dtype, list(x.shape), int((x != x).sum()))
print("keys", len(state))
"#;
    let py = python_with_safetensors()
        .args(["-c", script, dump.to_str().unwrap()])
        .output();
    let py = py.expect("python3 is needed for this test");
    let text = String::from_utf8_lossy(&py.stdout);
    assert!(
        py.status.success(),
        "python could not load the dump (pip install safetensors numpy): {}",
        String::from_utf8_lossy(&py.stderr)
    );
    // The batch after the pathology: 16 × 12 × 4 inputs, 1% of them NaN (8).
    assert!(text.contains("inputs float32 [16, 12, 4] 8"), "{text}");
}

fn reproducer(case: Case) -> Reproducer {
    let finding = nanhunt::run(&case)
        .unwrap()
        .finding()
        .cloned()
        .expect("unstable");
    Reproducer {
        format: REPRO_FORMAT,
        case,
        expected: Expected {
            signature: finding.signature,
            step: finding.step,
        },
        provenance: Provenance {
            nanhunt_version: "test".into(),
            source: "hand-written".into(),
            ..Default::default()
        },
    }
}

#[test]
fn reproducers_replay_and_say_when_fixed_or_different() {
    let dir = scratch("repro");
    let mut c = Case::example("rnn").unwrap();
    c.data.pathologies = vec![Pathology::Inf {
        fraction: 0.01,
        from_step: 1,
    }];
    let repro = reproducer(c);
    let path = dir.join("inf.json");
    std::fs::write(&path, repro.to_json()).unwrap();
    let out = nanhunt(&["replay", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));

    let mut fixed = repro.clone();
    fixed.case.data.pathologies.clear();
    std::fs::write(&path, fixed.to_json()).unwrap();
    let out = nanhunt(&["replay", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("no longer fails"), "{}", stdout(&out));

    let mut different = repro;
    different.case.data.pathologies = vec![Pathology::Nan {
        fraction: 0.01,
        from_step: 1,
    }];
    std::fs::write(&path, different.to_json()).unwrap();
    let out = nanhunt(&["replay", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("fails differently"),
        "{}",
        stdout(&out)
    );
}

/// A dump of the diverging case (in the scratch directory that holds
/// it), and its tensors.
fn dump_of_diverging_case(
    name: &str,
) -> (
    (crate::support::Scratch, std::path::PathBuf),
    std::collections::HashMap<String, candle_core::Tensor>,
) {
    let (dir, dump) = dump_diverging(name);
    let tensors =
        candle_core::safetensors::load(dump.join("scene.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    ((dir, dump), tensors)
}

fn replay_fails_with(dump: &std::path::Path, fragments: &[&str]) {
    let out = nanhunt(&["replay", dump.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}{}", stdout(&out));
    for f in fragments {
        assert!(err.contains(f), "`{f}` not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_dump_missing_a_tensor_or_holding_a_wrong_one_is_refused_with_the_tensor_named() {
    let ((_dir, dump), tensors) = dump_of_diverging_case("dump-incomplete");
    let state = dump.join("scene.safetensors");
    // Adam's second moment of one parameter is gone.
    let mut fewer = tensors.clone();
    fewer.remove("optimizer/v.block0.conv.weight").unwrap();
    candle_core::safetensors::save(&fewer, &state).unwrap();
    replay_fails_with(
        &dump,
        &[
            "cannot parse dump",
            "scene.safetensors",
            "`optimizer/v.block0.conv.weight`",
            "missing",
        ],
    );
    // A parameter saved in another dtype.
    let mut wrong = tensors.clone();
    let t = wrong["param/block0.conv.weight"]
        .to_dtype(candle_core::DType::F64)
        .unwrap();
    wrong.insert("param/block0.conv.weight".into(), t);
    candle_core::safetensors::save(&wrong, &state).unwrap();
    replay_fails_with(
        &dump,
        &["`param/block0.conv.weight`", "dtype F64, expected F32"],
    );
    // A moment of another shape than its parameter.
    let mut reshaped = tensors.clone();
    let t = reshaped["optimizer/m.block0.conv.weight"]
        .flatten_all()
        .unwrap();
    reshaped.insert("optimizer/m.block0.conv.weight".into(), t);
    candle_core::safetensors::save(&reshaped, &state).unwrap();
    replay_fails_with(&dump, &["`optimizer/m.block0.conv.weight`", "shape"]);
    // A batch that is not the step's: one input value changed.
    let mut edited = tensors.clone();
    let name = tensors
        .keys()
        .find(|k| k.starts_with("batch/"))
        .expect("a dump saves its batch")
        .clone();
    let t = &tensors[&name];
    let bumped = t
        .flatten_all()
        .unwrap()
        .to_dtype(candle_core::DType::F64)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, v)| if i == 0 { v + 1.0 } else { v })
        .collect::<Vec<f64>>();
    let bumped = candle_core::Tensor::new(bumped, &candle_core::Device::Cpu)
        .unwrap()
        .to_dtype(t.dtype())
        .unwrap()
        .reshape(t.dims())
        .unwrap();
    edited.insert(name.clone(), bumped);
    candle_core::safetensors::save(&edited, &state).unwrap();
    replay_fails_with(
        &dump,
        &[&format!("`{name}`"), "is not the batch scene.json records"],
    );
    // Not safetensors at all.
    std::fs::write(&state, b"not a safetensors file").unwrap();
    replay_fails_with(&dump, &["cannot parse dump", "scene.safetensors"]);
}

#[test]
fn a_dump_whose_step_lies_outside_its_case_is_refused() {
    let ((_dir, dump), _) = dump_of_diverging_case("dump-step");
    let stats_path = dump.join("scene.json");
    let mut stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats_path).unwrap()).unwrap();
    stats["step"] = serde_json::json!(1_000_000);
    std::fs::write(&stats_path, stats.to_string()).unwrap();
    replay_fails_with(
        &dump,
        &["scene.json", "failing step 1000000", "outside the case's"],
    );
}

/// `--dump-at STEP` writes a healthy step's scene, with mixup's λ: the
/// mixed inputs are recomputed from the source batch and λ alone, and the
/// step replays bit for bit.
#[test]
fn dump_at_writes_a_healthy_steps_scene_with_mixups_lambda() {
    let dir = scratch("dump-at");
    let mut c = Case::example("cnn").unwrap();
    c.steps = 6;
    c.augment = vec![Augment::Mixup { alpha: 0.4 }];
    let case = write_case(&dir, "case.json", &c);
    let dump = dir.join("scene");
    let out = nanhunt(&[
        "run",
        case.to_str().unwrap(),
        "--dump",
        dump.to_str().unwrap(),
        "--dump-at",
        "3",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("scene of step 3"), "{text}");

    let loaded = SavedScene::load(&dump).unwrap();
    assert_eq!(loaded.scene.step, 3);
    assert!(loaded.scene.finding.is_none());
    assert_eq!(
        loaded.scene.recent_losses.len(),
        4,
        "the dumped step's loss is included"
    );
    let lambda = loaded
        .scene
        .mix_lambda
        .expect("a mixed batch records its lambda");
    let saved: Vec<f64> = loaded.tensors["batch/mix_lambda"].to_vec1().unwrap();
    assert_eq!(saved, [lambda]);
    assert!(lambda > 0.0 && lambda < 1.0, "{lambda}");

    let rows = |name: &str| -> Vec<Vec<f32>> {
        let t = &loaded.tensors[name];
        let n = t.dims()[0];
        t.flatten_from(1)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap()
            .to_vec2()
            .unwrap()[..n]
            .to_vec()
    };
    let (mixed, source) = (rows("batch/inputs"), rows("source/inputs"));
    let (t2, targets) = (rows("batch/mix_targets"), rows("source/targets"));
    for (i, row) in mixed.iter().enumerate() {
        // Row i mixes source row i with the source row whose targets are t2[i].
        let j = (0..source.len()).find(|&j| {
            targets[j] == t2[i]
                && row
                    .iter()
                    .zip(&source[i])
                    .zip(&source[j])
                    .all(|((m, a), b)| {
                        (f64::from(*m) - (lambda * f64::from(*a) + (1.0 - lambda) * f64::from(*b)))
                            .abs()
                            < 1e-5
                    })
        });
        assert!(
            j.is_some(),
            "row {i} is not lambda·x_i + (1-lambda)·x_j for any j"
        );
    }

    let out = nanhunt(&["replay", dump.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(
        text.contains("reproduced: a healthy step at step 3"),
        "{text}"
    );
    assert!(text.contains("bit-identical"), "{text}");
    let out = nanhunt(&["inspect", dump.to_str().unwrap()]);
    assert!(
        stdout(&out).contains("healthy (dumped on request)"),
        "{}",
        stdout(&out)
    );

    // A step outside the case is refused, naming the option.
    let out = nanhunt(&[
        "run",
        case.to_str().unwrap(),
        "--dump",
        dir.join("other").to_str().unwrap(),
        "--dump-at",
        "6",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("dump_at"), "{}", stderr(&out));
}

/// A dump written by an earlier release (`stats.json` and
/// `state.safetensors`, the op a plain name) still loads and replays.
#[test]
fn a_dump_of_the_earlier_layout_still_replays() {
    let (_dir, dump) = dump_diverging("dump-legacy");
    let scene: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dump.join("scene.json")).unwrap()).unwrap();
    let optimizer_steps = scene["optimizer"]["steps"].clone();
    let mut finding = scene["finding"].clone();
    finding["op"] = serde_json::json!("trend");
    let legacy = serde_json::json!({
        "nanhunt_version": "0.1.0",
        "step": scene["step"],
        "finding": finding,
        "recent_losses": scene["recent_losses"],
        "grad_norms": scene["grad_norms"],
        "tensors": scene["tensors"],
        "environment": scene["environment"],
        "resume": {
            "optimizer_steps": optimizer_steps,
            "scaler": scene["scaler"],
            "tracker": scene["tracker"],
            "trace": scene["history"],
        },
    });
    std::fs::write(dump.join("stats.json"), legacy.to_string()).unwrap();
    std::fs::rename(
        dump.join("scene.safetensors"),
        dump.join("state.safetensors"),
    )
    .unwrap();
    std::fs::remove_file(dump.join("scene.json")).unwrap();
    let out = nanhunt(&["replay", dump.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("reproduced: divergence in update"), "{text}");
    assert!(text.contains("bit-identical"), "{text}");
}
