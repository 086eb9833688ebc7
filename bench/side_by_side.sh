#!/usr/bin/env bash
# The side-by-side benchmark: the same five models and the fuzz workload in
# PyTorch (bench/pytorch_bench.py) and in nanhunt (bench/tools/src/bin/
# side_by_side.rs), both at one compute thread. It prints the CPU and its
# vector extensions first: the figures hold for that class of CPU.
#
# Speed: nanhunt, PyTorch eager and PyTorch compiled (torch.compile,
# inductor on this CPU, where it compiles; the table says why where it
# cannot) each keep one model alive and take turns in chunks of CHUNK_STEPS
# steps (bench/paired.py), CHUNKS chunks a model a round; each chunk gives
# a ratio of median step times, and the table shows the median over all
# chunks of all rounds, with the middle half of those ratios beside it. A
# slow spell of a shared machine then falls on the three alike: timed one
# after the other, seconds apart, the same binary's step moved by a third.
#
# Overheads: nanhunt's probe (interleaved step by step with the probe off,
# in one process) and PyTorch's detect_anomaly, over STEPS steps a round.
#
#   bench/side_by_side.sh [STEPS] [ROUNDS]   (PYTHON: a python with torch; default python3;
#                                             CHUNKS, default 30; CHUNK_STEPS, default 10;
#                                             FEATURES: cargo features of the bench build)
#
# PyTorch is not a dependency of the project or of CI (`pip install torch`
# from PyPI brings CUDA wheels, about 3 GB); install it where you run this.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-30}"
ROUNDS="${2:-1}"
PYTHON="${PYTHON:-python3}"
CHUNKS="${CHUNKS:-30}"
CHUNK_STEPS="${CHUNK_STEPS:-10}"
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
bash bench/cpu.sh
cargo build --quiet --release -p nanhunt-bench-tools --bin side_by_side ${FEATURES:+--features "$FEATURES"}
target/release/side_by_side builds
for round in $(seq "$ROUNDS"); do
  for f in cnn transformer rnn decoder encoder fuzz; do
    RAYON_NUM_THREADS=1 target/release/side_by_side "$STEPS" "$f" >>"$OUT"
    OMP_NUM_THREADS=1 "$PYTHON" bench/pytorch_bench.py "$STEPS" "$f" nocompile >>"$OUT"
    if [ "$f" != fuzz ]; then
      python3 bench/paired.py target/release/side_by_side "$PYTHON" "$f" \
        "$CHUNKS" "$CHUNK_STEPS" | sed 's/^{/{"framework": "paired", /' >>"$OUT"
    fi
  done
done
python3 - "$OUT" "$ROUNDS" "$CHUNKS" "$CHUNK_STEPS" <<'PY'
import json, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1])]
rounds, chunks, per = (int(a) for a in sys.argv[2:5])
by = defaultdict(list)  # (framework, family) -> one row per round, in order
for r in rows:
    by[(r["framework"], r["family"])].append(r)
med = statistics.median


def speed(ratios):
    """The median ratio and the middle half of them."""
    if len(ratios) < 4:
        return f"{med(ratios):.2f}x"
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return f"{med(ratios):.2f}x ({q1:.2f}–{q3:.2f})"


print(f"{rounds} round(s) of {chunks} paired chunks of {per} steps a model; speed: the median "
      "chunk ratio (the middle half of the chunk ratios); ms/step: the median over rounds")
print()
print("| model | nanhunt ms/step | PyTorch eager ms/step | speed vs eager | PyTorch compiled ms/step | speed vs compiled | nanhunt probe overhead | PyTorch detect_anomaly overhead |")
print("|---|---|---|---|---|---|---|---|")
cannot = []
for f in ["cnn", "transformer", "rnn", "decoder", "encoder"]:
    pairs = by[("paired", f)]
    ms = lambda who: f"{med([p['ms_per_step'][who] for p in pairs]):.2f}"
    eager = [r for p in pairs for r in p["chunk_ratios"]["eager"]]
    if all("compiled" in p["chunk_ratios"] for p in pairs):
        compiled = ms("compiled"), speed([r for p in pairs for r in p["chunk_ratios"]["compiled"]])
    else:
        compiled = "cannot compile", "–"
        cannot.append(f"{f}: {next(p['compile_error'] for p in pairs if p['compile_error'])}")
    probe = med([n["probe_overhead"] for n in by[("nanhunt", f)]])
    anomaly = med([p["detect_anomaly_overhead"] for p in by[("pytorch", f)]])
    print(f"| {f} | {ms('nanhunt')} | {ms('eager')} | {speed(eager)} "
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
