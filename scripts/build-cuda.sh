#!/usr/bin/env bash
# Builds the CUDA nanhunt binary (`--features cuda`) on a machine with no GPU
# and no system CUDA toolkit, from PyPI's CUDA 13.0 wheels:
#
#   scripts/build-cuda.sh            # → target/release/nanhunt (CUDA build)
#
# Environment: CUDA_COMPUTE_CAP (default 90, Hopper), CUDA_VENV (where the
# wheels go, default target/cuda-venv), CARGO_TARGET_DIR (default
# target-cuda, so the CPU build in target/ is left alone).
#
# The binary links libcuda.so.1, libcublas.so.13, libcublasLt.so.13,
# libcurand.so.10, libcudart.so.13 and libnvrtc.so.13 at load time. No
# wheel ships libcuda (the driver), so the link uses a generated stub whose
# every cu* function returns CUDA_ERROR_NO_DEVICE; it lives only in the
# build tree and must never be shipped: the GPU machine's driver provides
# the real libcuda.so.1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CUDA_VENV="${CUDA_VENV:-$ROOT/target/cuda-venv}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target-cuda}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CUDARC_CUDA_VERSION=13000

# 1. The toolkit from PyPI (about 1.2 GB). nvvm is pinned: nvcc's own
#    dependency on it is unpinned and pulls 13.5, whose PTX 9.5 neither
#    ptxas 13.0 nor driver 580 accept.
if [ ! -x "$CUDA_VENV/bin/python" ]; then
    python3 -m venv "$CUDA_VENV"
fi
"$CUDA_VENV/bin/pip" install --quiet --disable-pip-version-check \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 \
    nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35
CU13="$("$CUDA_VENV/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
[ -x "$CU13/bin/nvcc" ] || { echo "no nvcc under $CU13/bin" >&2; exit 2; }

# 2. A CUDA_HOME the build scripts understand: include/, bin/, nvvm/ and
#    lib64/ with unversioned names, plus the link-only driver stub.
export CUDA_HOME="$CARGO_TARGET_DIR/cuda-home"
mkdir -p "$CUDA_HOME/lib64/stubs"
for d in bin include nvvm; do ln -sfn "$CU13/$d" "$CUDA_HOME/$d"; done
for lib in cudart cublas cublasLt curand nvrtc; do
    versioned="$(ls "$CU13/lib/lib$lib.so."* | sort | head -1)"
    ln -sf "$versioned" "$CUDA_HOME/lib64/lib$lib.so"
done
CUDARC_SYS="$(cargo metadata --format-version 1 --manifest-path harness/Cargo.toml --features cuda \
    | python3 -c 'import json,sys; m=json.load(sys.stdin); print([p["manifest_path"] for p in m["packages"] if p["name"]=="cudarc"][0])')"
CUDARC_SYS="$(dirname "$CUDARC_SYS")/src/driver/sys/mod.rs"
{
    echo "/* Link-only stub of the CUDA driver API: every call fails with CUDA_ERROR_NO_DEVICE (100). */"
    grep -oE 'fn cu[A-Z][A-Za-z0-9_]*\(' "$CUDARC_SYS" | sort -u | sed -E 's/fn (cu[A-Za-z0-9_]*)\(/int \1(void) { return 100; }/'
} >"$CUDA_HOME/lib64/stubs/cuda_stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CUDA_HOME/lib64/stubs/libcuda.so" "$CUDA_HOME/lib64/stubs/cuda_stub.c"

# 3. The build (a cold one takes about 11 minutes on 2 cores, 7 of them
#    nvcc compiling candle's kernels).
export PATH="$CU13/bin:$PATH"
export LIBRARY_PATH="$CUDA_HOME/lib64:$CUDA_HOME/lib64/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
cargo build --release -p nanhunt --features cuda
BIN="$CARGO_TARGET_DIR/release/nanhunt"
echo "built $BIN ($(du -h "$BIN" | cut -f1)); it loads:"
readelf -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/  \1/p'
