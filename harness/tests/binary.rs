//! The `nanhunt` binary itself (the `tests/` crate runs the full CLI suite
//! against the binary this target makes cargo build).

use std::process::Command;

fn nanhunt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nanhunt"))
}

#[test]
fn cuda_device_without_cuda_support_is_a_clear_usage_error() {
    if nanhunt::device::cuda_compiled() {
        return; // this build has CUDA: the error path does not exist
    }
    let case = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/cases/valid/rnn.json");
    let out = nanhunt()
        .args(["run", case, "--device", "cuda:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("built without CUDA support"), "{stderr}");
}

#[test]
fn usage_errors_exit_with_2() {
    let out = nanhunt().args(["run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = nanhunt()
        .args(["example", "--family", "mlp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
