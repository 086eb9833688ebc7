//! The fuzz targets' library side: artifacts become reproducers that replay.
//! (The libFuzzer binaries themselves are built and run by `.ci/run`.)

use crate::support::*;
use nanhunt::fuzzing::{safe_envelope_target, Envelope, Verdict};
use nanhunt::rng::Rng;

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::keyed(seed, "fuzz.test", 0);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

#[test]
fn a_planted_envelope_artifact_becomes_a_reproducer_that_replays() {
    // An input that violates the planted (unsafe) envelope, as libFuzzer
    // would have saved it.
    let bytes = (1000..1300)
        .map(|s| random_bytes(s, 256))
        .find(|b| {
            matches!(
                safe_envelope_target(b, Envelope::Planted),
                Verdict::Violation(_)
            )
        })
        .expect("the planted envelope is violated within 300 inputs");
    let dir = scratch("import-artifact");
    let artifact = dir.join("crash-planted");
    std::fs::write(&artifact, &bytes).unwrap();
    let out = dir.join("repro");
    let import = |envelope: &str| {
        nanhunt(&[
            "import-artifact",
            artifact.to_str().unwrap(),
            "--target",
            "safe_envelope",
            "--envelope",
            envelope,
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let o = import("planted");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("went non-finite"), "{}", stderr(&o));
    let repros: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(repros.len(), 1, "{repros:?}");
    let name = repros[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("nan-update-"), "{name}");
    let replay = nanhunt(&["replay", repros[0].to_str().unwrap()]);
    assert_eq!(replay.status.code(), Some(0), "{}", stdout(&replay));

    // Under the documented envelope the same bytes pass: the case is kept.
    let o = import("documented");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("passes now"), "{}", stderr(&o));
    assert!(std::fs::read_dir(&out).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_str()
        .unwrap()
        .ends_with(".case.json")));
}

#[test]
fn non_training_artifacts_print_their_decoded_input() {
    let dir = scratch("import-losses");
    let artifact = dir.join("crash");
    std::fs::write(&artifact, random_bytes(7, 128)).unwrap();
    let o = nanhunt(&[
        "import-artifact",
        artifact.to_str().unwrap(),
        "--target",
        "losses",
    ]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    let input: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(input["logits"].is_array(), "{input}");
}

#[test]
fn bad_artifact_arguments_exit_2() {
    let o = nanhunt(&[
        "import-artifact",
        "/nonexistent/crash",
        "--target",
        "losses",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("/nonexistent/crash"), "{}", stderr(&o));
    let o = nanhunt(&["import-artifact", "/nonexistent/crash", "--target", "nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nope"), "{}", stderr(&o));
}
