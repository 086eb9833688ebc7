//! The CUDA build (`--features cuda`) compiles the probe's kernel
//! (`src/probe/scan_row.cu`) to PTX with nvcc; the driver JIT-compiles it
//! for the GPU at hand on first use. The CPU build does nothing here.

use std::path::PathBuf;
use std::process::Command;

const KERNEL: &str = "src/probe/scan_row.cu";

fn main() {
    println!("cargo:rerun-if-changed={KERNEL}");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("scan_row.ptx");
    // PTX for an older generation runs on every newer one; 75 is the
    // oldest CUDA 13's nvcc targets. CUDA_COMPUTE_CAP (as for candle's
    // kernels) picks another.
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "75".into());
    let nvcc = match std::env::var_os("CUDA_HOME") {
        Some(home) => PathBuf::from(home).join("bin").join("nvcc"),
        None => PathBuf::from("nvcc"),
    };
    let status = Command::new(&nvcc)
        .args([
            "--ptx",
            "-O3",
            &format!("--gpu-architecture=compute_{cap}"),
            "-o",
        ])
        .arg(&out)
        .arg(KERNEL)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{} could not compile {KERNEL} ({s})", nvcc.display()),
        Err(e) => panic!(
            "the CUDA build needs nvcc to compile {KERNEL}: {} ({e}); set CUDA_HOME or use scripts/build-cuda.sh",
            nvcc.display()
        ),
    }
}
