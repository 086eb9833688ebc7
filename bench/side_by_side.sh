#!/usr/bin/env bash
# The side-by-side benchmark: the same five models and the fuzz workload in
# PyTorch (bench/pytorch_bench.py) and in nanhunt (harness/examples/
# side_by_side.rs), both at one compute thread, run in one go, with the
# nanhunt/PyTorch speed ratio per model (against eager and against
# torch.compile, inductor on this CPU, where it compiles; the table says
# why where it cannot) and for the fuzz workload, and PyTorch's
# detect_anomaly overhead beside nanhunt's probe overhead. The two run
# model by model, each model in nanhunt and then in PyTorch.
#
#   bench/side_by_side.sh [STEPS] [ROUNDS]   (PYTHON: a python with torch; default python3)
#
# PyTorch is not a dependency of the project or of CI (`pip install torch`
# from PyPI brings CUDA wheels, about 3 GB); install it where you run this.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-30}"
ROUNDS="${2:-1}"
PYTHON="${PYTHON:-python3}"
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
cargo build --quiet --release -p nanhunt --example side_by_side
# Each model in both frameworks one after the other, so that a slow minute
# of a shared machine falls on both sides of a ratio rather than on one;
# with ROUNDS > 1 the whole sequence repeats and each figure is the median
# over the rounds (a ratio: the median of the rounds' ratios).
for round in $(seq "$ROUNDS"); do
  for f in cnn transformer rnn decoder encoder fuzz; do
    RAYON_NUM_THREADS=1 target/release/examples/side_by_side "$STEPS" "$f" >>"$OUT"
    OMP_NUM_THREADS=1 "$PYTHON" bench/pytorch_bench.py "$STEPS" "$f" >>"$OUT"
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1])]
rounds = int(sys.argv[2])
by = defaultdict(list)  # (framework, family) -> one row per round, in order
for r in rows:
    by[(r["framework"], r["family"])].append(r)
med = statistics.median
print(f"{rounds} round(s); each figure the median over them")
print()
print("| model | nanhunt ms/step | PyTorch eager ms/step | speed vs eager | PyTorch compiled ms/step | speed vs compiled | nanhunt probe overhead | PyTorch detect_anomaly overhead |")
print("|---|---|---|---|---|---|---|---|")
cannot = []
for f in ["cnn", "transformer", "rnn", "decoder", "encoder"]:
    ns, ps = by[("nanhunt", f)], by[("pytorch", f)]
    n_ms = [n["ms_per_step"] for n in ns]
    p_ms = [p["ms_per_step"] for p in ps]
    eager = med([p / n for p, n in zip(p_ms, n_ms)])
    c_ms = [p.get("compiled_ms_per_step") for p in ps]
    if any(c is None for c in c_ms):
        compiled = "cannot compile", "–"
        p = next(p for p in ps if p.get("compiled_ms_per_step") is None)
        cannot.append(f"{f}: {p.get('compile_error') or 'this PyTorch has no torch.compile'}")
    else:
        ratio = med([c / n for c, n in zip(c_ms, n_ms)])
        compiled = f"{med(c_ms):.2f}", f"{ratio:.2f}x"
    probe = med([n["probe_overhead"] for n in ns])
    anomaly = med([p["detect_anomaly_overhead"] for p in ps])
    print(f"| {f} | {med(n_ms):.2f} | {med(p_ms):.2f} | {eager:.2f}x "
          f"| {compiled[0]} | {compiled[1]} "
          f"| {100 * probe:+.1f}% | {100 * anomaly:+.0f}% |")
ns, ps = by[("nanhunt", "fuzz_cnn_5_steps")], by[("pytorch", "fuzz_cnn_5_steps")]
n_s = [n["steps_per_s"] for n in ns]
p_s = [p["steps_per_s"] for p in ps]
print(f"| fuzz workload (fresh 5-step CNN runs) | {med(n_s):.1f} steps/s | {med(p_s):.1f} steps/s "
      f"| {med([n / p for n, p in zip(n_s, p_s)]):.2f}x | | | | |")
for line in cannot:
    print(f"\ntorch.compile could not compile {line}")
PY
