#!/usr/bin/env bash
# The side-by-side benchmark: the same five models and the fuzz workload in
# PyTorch (bench/pytorch_bench.py) and in nanhunt (harness/examples/
# side_by_side.rs), both at one compute thread, run in one go, with the
# nanhunt/PyTorch speed ratio per model (against eager and against
# torch.compile, inductor on this CPU, where it compiles; the table says
# why where it cannot) and for the fuzz workload, and PyTorch's
# detect_anomaly overhead beside nanhunt's probe overhead.
#
#   bench/side_by_side.sh [STEPS]      (PYTHON: a python with torch; default python3)
#
# PyTorch is not a dependency of the project or of CI (`pip install torch`
# from PyPI brings CUDA wheels, about 3 GB); install it where you run this.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-30}"
PYTHON="${PYTHON:-python3}"
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
cargo build --quiet --release -p nanhunt --example side_by_side
RAYON_NUM_THREADS=1 target/release/examples/side_by_side "$STEPS" >>"$OUT"
OMP_NUM_THREADS=1 "$PYTHON" bench/pytorch_bench.py "$STEPS" >>"$OUT"
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["framework"], r["family"]): r for r in rows}
print("| model | nanhunt ms/step | PyTorch eager ms/step | speed vs eager | PyTorch compiled ms/step | speed vs compiled | nanhunt probe overhead | PyTorch detect_anomaly overhead |")
print("|---|---|---|---|---|---|---|---|")
cannot = []
for f in ["cnn", "transformer", "rnn", "decoder", "encoder"]:
    n, p = by[("nanhunt", f)], by[("pytorch", f)]
    c = p.get("compiled_ms_per_step")
    if c is None:
        compiled = "cannot compile", "–"
        cannot.append(f"{f}: {p.get('compile_error') or 'this PyTorch has no torch.compile'}")
    else:
        compiled = f"{c:.2f}", f"{c / n['ms_per_step']:.2f}x"
    print(f"| {f} | {n['ms_per_step']:.2f} | {p['ms_per_step']:.2f} | {p['ms_per_step'] / n['ms_per_step']:.2f}x "
          f"| {compiled[0]} | {compiled[1]} "
          f"| {100 * n['probe_overhead']:+.1f}% | {100 * p['detect_anomaly_overhead']:+.0f}% |")
n, p = by[("nanhunt", "fuzz_cnn_5_steps")], by[("pytorch", "fuzz_cnn_5_steps")]
print(f"| fuzz workload (fresh 5-step CNN runs) | {n['steps_per_s']:.1f} steps/s | {p['steps_per_s']:.1f} steps/s "
      f"| {n['steps_per_s'] / p['steps_per_s']:.2f}x | | | | |")
for line in cannot:
    print(f"\ntorch.compile could not compile {line}")
PY
