//! The only module that knows about CUDA. Without the `cuda` feature,
//! `cuda:N` still parses and fails here with a sentence, so call sites carry
//! no `cfg`.

use crate::error::{Error, Result};
use crate::spec::DeviceSpec;
use candle_core::Device;

/// Opens a device.
pub fn open(spec: DeviceSpec) -> Result<Device> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::Cpu),
        DeviceSpec::Cuda(i) => {
            if !candle_core::utils::cuda_is_available() {
                return Err(Error::Device {
                    device: spec.to_string(),
                    reason: "this nanhunt was built without CUDA support; rebuild with `--features cuda`".into(),
                });
            }
            Device::new_cuda(i).map_err(|e| {
                // candle appends a backtrace when RUST_BACKTRACE is set: keep the sentence.
                let message = e.to_string();
                let first = message.lines().next().unwrap_or_default();
                let hint = if first.contains("NO_DEVICE") || first.contains("INVALID_DEVICE") {
                    " (no such GPU: check `nvidia-smi` and the NVIDIA driver)"
                } else {
                    ""
                };
                Error::Device {
                    device: spec.to_string(),
                    reason: format!("{first}{hint}"),
                }
            })
        }
    }
}

/// A rayon pool of `threads` threads: candle's CPU ops run in the pool they
/// are called from, so `pool.install` bounds a run's compute threads
/// (campaign and table workers use one each; `diff --threads` compares counts).
pub fn cpu_pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| {
            Error::option(
                "threads",
                format!("cannot start {threads} compute threads: {e}"),
            )
        })
}

/// Whether this build can run on CUDA at all.
pub fn cuda_compiled() -> bool {
    candle_core::utils::cuda_is_available()
}

/// Whether a CUDA device can be opened here (a CUDA build on a machine
/// without a GPU cannot): commands that add a CUDA comparison on their
/// own (diagnose) ask this, not [`cuda_compiled`].
pub fn cuda_usable() -> bool {
    cuda_compiled() && Device::new_cuda(0).is_ok()
}

/// Keeps freed memory in the process instead of handing it back to the OS.
///
/// A training step allocates a fresh buffer per candle op, many above
/// glibc's mmap threshold; with the defaults each one is a new mapping
/// whose pages fault in zeroed and are unmapped again at the end of the
/// step, which cost a third of a Transformer step. With these settings
/// the heap keeps its peak size and buffers are reused. The binary calls
/// this at startup; library users may call it once at theirs. A no-op
/// outside glibc.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator parameters; it is safe to call
    // at any time, from any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}
