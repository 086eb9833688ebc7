#!/usr/bin/env bash
# The CPU a benchmark runs on, and the vector extensions its kernels (and
# PyTorch's) can use: every figure in docs/PERFORMANCE.md states them.
#
#   bench/cpu.sh    → "cpu: AMD EPYC … (2 cores); vector extensions: avx2 fma avx512f …"
set -euo pipefail
model="$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)"
cores="$(nproc 2>/dev/null || echo '?')"
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2- || true) "
have=()
for f in avx avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8; do
  case "$flags" in *" $f "*) have+=("$f") ;; esac
done
echo "cpu: ${model:-unknown} ($cores cores); vector extensions: ${have[*]:-none of the x86 ones}"
