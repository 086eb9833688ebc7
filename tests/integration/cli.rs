//! `nanhunt` end to end: what a user at a terminal or in CI sees.

use crate::support::*;

/// Each invalid case file and a fragment its error must contain (the field or
/// the reason), so that the message tells the user what to fix.
const INVALID: [(&str, &str); 30] = [
    ("not_json", "cannot parse case"),
    ("truncated", "EOF while parsing"),
    ("empty", "EOF while parsing"),
    ("unknown_field", "unknown field `learning_rate`"),
    ("unknown_nested_field", "unknown field `betas`"),
    ("unsupported_format", "field `format`"),
    ("batch_zero", "field `batch_size`"),
    (
        "heads_do_not_divide_d_model",
        "d_model 30 is not divisible by heads 4",
    ),
    ("negative_lr", "field `optimizer.lr`"),
    ("nan_lr", "expected f64"),
    ("too_many_parameters", "parameters exceed the limit"),
    ("unknown_family", "unknown variant `mlp`"),
    ("steps_not_a_number", "invalid type: string \"fifty\""),
    (
        "residual_channel_mismatch",
        "field `model.blocks[1].residual`",
    ),
    ("missing_loss", "missing field `loss`"),
    ("unknown_device", "unknown device `tpu:0`"),
    ("nan_pathology_on_tokens", "field `data.pathologies[0]`"),
    (
        "label_pathology_without_labels",
        "needs a loss on class labels",
    ),
    ("no_conv_blocks", "field `model.blocks`"),
    ("erasing_probability_above_one", "field `augment[0].p`"),
    ("too_many_steps", "field `steps`"),
    ("even_kernel", "must be odd"),
    ("pooling_below_2x2", "field `model.blocks[1].pool`"),
    (
        "bf16_convolution_on_cpu",
        "bf16 convolutions are not supported on CPU",
    ),
    (
        "decoder_kv_heads_do_not_divide_heads",
        "field `model.kv_heads`: must divide heads 4",
    ),
    (
        "decoder_odd_head_width",
        "field `model.heads`: d_model 18 must split into 2 heads of an even width",
    ),
    (
        "encoder_positive_mask_value",
        "field `model.mask.value`: must be finite and negative",
    ),
    (
        "encoder_min_length_above_seq_len",
        "field `model.min_length`: must be at most seq_len 8",
    ),
    (
        "custom_knob_outside_its_range",
        "field `model.knobs.ln_eps`: `value` must be finite and within [1e-12, 1e-3]",
    ),
    (
        "custom_init_override_negative_std",
        "field `model.init_overrides.token`: `std` must be finite and >= 0",
    ),
];

#[test]
fn every_invalid_case_file_gives_a_clear_error_and_exit_2() {
    let dir = cases("invalid");
    let on_disk = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(
        on_disk,
        INVALID.len(),
        "every file in {} needs an entry here",
        dir.display()
    );
    for (name, fragment) in INVALID {
        let path = dir.join(format!("{name}.json"));
        for command in ["run", "gradcheck"] {
            let out = nanhunt(&[command, path.to_str().unwrap()]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{command} {name}: {err}");
            assert!(
                err.contains(fragment),
                "{command} {name}: `{fragment}` not in: {err}"
            );
            assert!(
                err.contains(&format!("{name}.json")),
                "{name}: the error must name the file: {err}"
            );
            assert!(!err.contains("panicked"), "{name}: {err}");
        }
    }
}

#[test]
fn missing_files_and_directories_are_io_errors() {
    let out = nanhunt(&["run", "no/such/case.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no/such/case.json"),
        "{}",
        stderr(&out)
    );
    let out = nanhunt(&["run", cases("valid").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn limits_are_configurable_from_the_command_line() {
    let case = cases("valid/cnn.json");
    let out = nanhunt(&["run", case.to_str().unwrap(), "--max-params", "100"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("exceed the limit of 100"),
        "{}",
        stderr(&out)
    );
    let out = nanhunt(&["run", case.to_str().unwrap(), "--max-steps", "10"]);
    assert!(stderr(&out).contains("field `steps`"), "{}", stderr(&out));
}

#[test]
fn examples_are_valid_cases_that_run_stable() {
    let dir = scratch("examples");
    for family in ["cnn", "transformer", "rnn"] {
        let out = nanhunt(&["example", "--family", family]);
        assert_eq!(out.status.code(), Some(0));
        let path = dir.join(format!("{family}.json"));
        std::fs::write(&path, stdout(&out)).unwrap();
        // The checked-in copies are what `nanhunt example` prints today.
        let checked_in = std::fs::read_to_string(cases(&format!("valid/{family}.json"))).unwrap();
        assert_eq!(
            stdout(&out),
            checked_in,
            "tests/cases/valid/{family}.json is stale"
        );
        let run = nanhunt(&["run", path.to_str().unwrap()]);
        assert_eq!(
            run.status.code(),
            Some(0),
            "{}{}",
            stdout(&run),
            stderr(&run)
        );
        assert!(stdout(&run).contains("verdict: STABLE"));
    }
}

#[test]
fn unstable_runs_exit_1_and_json_output_is_one_object() {
    let mut case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cases("valid/rnn.json")).unwrap()).unwrap();
    case["data"]["pathologies"] = serde_json::json!([{ "kind": "nan", "fraction": 0.01 }]);
    let dir = scratch("unstable");
    let path = dir.join("nan.json");
    std::fs::write(&path, case.to_string()).unwrap();
    let out = nanhunt(&["run", path.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["verdict"], "unstable");
    assert_eq!(v["finding"]["phase"], "data");
    assert_eq!(v["finding"]["signature"]["kind"], "nan");
    // Human output names the verdict, the stage and the signature.
    let out = nanhunt(&["run", path.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(
        text.contains("verdict: UNSTABLE at step 0: nan in data at `data.pathologies[0].nan`"),
        "{text}"
    );
    assert!(
        text.contains("signature: nan-data-data.pathologies.nan-rnn-adam-f32-cpu"),
        "{text}"
    );
}

#[test]
fn gradcheck_passes_on_every_example() {
    for family in ["cnn", "transformer", "rnn"] {
        let case = cases(&format!("valid/{family}.json"));
        let out = nanhunt(&["gradcheck", case.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
        assert!(stdout(&out).contains("all gradients match"));
    }
}

#[test]
fn diff_compares_threads_precisions_and_names_the_missing_cuda() {
    let case = cases("valid/transformer.json");
    let case = case.to_str().unwrap();
    // One device, two thread counts: bit-identical.
    let o = nanhunt(&["diff", case, "--threads", "1,2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("verdict: AGREE"));
    // Pure bf16 leaves f64 beyond the loose tolerance: exit 1, the step named.
    let o = nanhunt(&["diff", case, "--precisions", "f64,bf16", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(d["tolerance"]["name"], "loose");
    assert_eq!(d["disagreements"][0]["arm"], "bf16");
    assert!(d["disagreements"][0]["step"].as_u64().is_some());
    // Without the cuda feature the device fails by name, exit 2.
    if !nanhunt::device::cuda_compiled() {
        let o = nanhunt(&["diff", case, "--devices", "cpu,cuda:0"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(
            stderr(&o).contains("built without CUDA support"),
            "{}",
            stderr(&o)
        );
    }
    let o = nanhunt(&["diff", case]);
    assert_eq!(o.status.code(), Some(2));
}

/// A user's example built with `nanhunt::cli::main_with` runs every command
/// over its own model: `run` is stable, `hunt` triggers the latent bug and
/// writes a reproducer that `replay` reproduces through the same binary,
/// `fuzz` (worker processes of that binary) names the model and its data,
/// and bad arguments exit 2.
#[test]
fn a_users_example_binary_runs_every_command_over_its_model() {
    let exe = example_binary("user_model");
    let dir = scratch("user-model-cli");
    let run = |args: &[&str]| {
        std::process::Command::new(&exe)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let o = run(&["run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("case: rms_mlp /") && stdout(&o).contains("STABLE"));
    assert!(stdout(&run(&["example"])).contains("\"name\": \"rms_mlp\""));

    let o = run(&["hunt", "--out", "hunt", "--no-drift"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("hunt/risk.json")).unwrap())
            .unwrap();
    assert_eq!(report["model"], "rms_mlp");
    // Nothing declared: the instrumented forward's division is found,
    // searched and triggered at its line.
    let stage = &report["stages"][0];
    assert_eq!(
        (&stage["stage"], &stage["status"]),
        (&"RmsNormMlp::forward.div".into(), &"triggered".into())
    );
    assert_eq!(stage["site"]["text"], "x.broadcast_div(&rms)");
    assert_eq!(stage["site"]["file"], "harness/examples/user_model.rs");
    for f in ["risk.md", "risk.html"] {
        assert!(dir.join("hunt").join(f).is_file(), "{f}");
    }
    let repro = format!("hunt/reproducers/{}", stage["reproducer"].as_str().unwrap());
    let o = run(&["replay", &repro]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("reproduced: nan in forward at `RmsNormMlp::forward.div` (rms_mlp"),
        "{}",
        stdout(&o)
    );

    // The trigger diagnosed from its reproducer: the repair as a diff of
    // the division's line, verified on the trigger's step, over the case
    // and by a re-hunt.
    let o = run(&["diagnose", &repro]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    for want in [
        "[verified fix]",
        "--- harness/examples/user_model.rs:40",
        "- x.broadcast_div(&rms)",
        "+ x.broadcast_div(&rms.maximum(1e-8)?)",
        "the trigger's step passes; on the case over 50 steps, stable and learning, as the model as written does",
        "re-hunted within 200× the data's scale: no trigger at the ops it rewrote",
        "diagnostic, not a repair",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert!(
        !out.contains("FIX `RmsNormMlp::forward.div` guarded"),
        "{out}"
    );
    // A scene without its case (a guard's) is refused by name, exit 2.
    let guard_scene = dir.join("guard-scene");
    std::fs::create_dir_all(&guard_scene).unwrap();
    for f in ["scene.json", "scene.safetensors"] {
        std::fs::copy(dir.join(&repro).join(f), guard_scene.join(f)).unwrap();
    }
    let o = run(&["diagnose", "guard-scene"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("guard-scene"), "{}", stderr(&o));

    let o = run(&["fuzz", "--runs", "12", "--out", "fuzz", "--quiet"]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    let md = std::fs::read_to_string(dir.join("fuzz/report.md")).unwrap();
    assert!(
        md.contains("families rms_mlp") && md.contains("data synthetic, as `rms_mlp`'s case"),
        "{md}"
    );
    assert!(stdout(&o).contains("unstable, 0 errors"), "{}", stdout(&o));

    for bad in [
        &["hunt", "--bound", "0"][..],
        &["hunt", "--token-swaps", "0"][..],
        &["run", "missing.json"],
        &["fuzz", "--runs", "x"],
        &["no-such-command"],
    ] {
        let o = run(bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{bad:?}: {}", stderr(&o));
    }
}

/// A minimized reproducer is diagnosed over the case it came from: its
/// fixes train over that case's steps, never over the two the minimizer
/// kept ("stable and learning" printed for one step was the bug).
#[test]
fn a_minimized_reproducer_is_diagnosed_over_the_case_it_came_from() {
    let dir = scratch("diagnose-minimized");
    let mut case = nanhunt::spec::Case::example("cnn").unwrap();
    case.optimizer = sgd(50.0);
    let path = dir.join("lr50.json");
    std::fs::write(&path, case.to_json()).unwrap();
    let repro = dir.join("repro.json");
    let (p, r) = (path.to_str().unwrap(), repro.to_str().unwrap());
    let o = nanhunt(&["minimize", p, "--out", r]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let kept = nanhunt::repro::Reproducer::load(&repro).unwrap();
    assert!(kept.case.steps < 50, "{}", kept.case.steps);
    let o = nanhunt(&["diagnose", r]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(
        out.starts_with("diagnosed over the case it was minimized from"),
        "{out}"
    );
    let verified: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("FIX"))
        .collect();
    assert!(!verified.is_empty(), "{out}");
    for l in verified {
        assert!(l.contains("stable and learning over 50 steps"), "{l}");
    }
}
