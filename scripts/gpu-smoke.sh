#!/usr/bin/env bash
# The GPU smoke run, for a machine with an NVIDIA GPU and driver but no Rust:
# run it from the repository root with the CUDA binary built by
# scripts/build-cuda.sh, and the CUDA 13 libraries (libcublas.so.13,
# libcublasLt.so.13, libcurand.so.10, libcudart.so.13, libnvrtc.so.13) on
# LD_LIBRARY_PATH, e.g. from a PyTorch cu13 environment:
#
#   LD_LIBRARY_PATH=$(python3 -c 'import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],"cu13","lib"))') \
#       scripts/gpu-smoke.sh target-cuda/release/nanhunt
#
# It prints the device (the article's step 5), runs every family forward and
# backward on CUDA in f32, bf16 and f16, the CPU↔CUDA differential on each
# family, the probe's cost per cnn step on CUDA (a check fails above 5%), a
# short campaign on CUDA and on the CPU with the same jobs (runs per second
# of both; a check fails when CUDA's is more than 5% lower: two identical
# CPU campaigns of 5 s differed by 3% on a 2-core machine), and one LR
# table on CUDA.
# SMOKE_BUDGET (default 60s) is each campaign's budget. Well under 10
# minutes on an H200. Exit status: the number of failed checks.
set -uo pipefail
BIN="${1:-target-cuda/release/nanhunt}"
DEV="${NANHUNT_DEVICE:-cuda:0}"
BUDGET="${SMOKE_BUDGET:-60s}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failed=0
check() { # check NAME COMMAND... (exit 0 or 1 pass: stable or unstable; 2 is an error)
    local name="$1"; shift
    local out rc
    out="$("$@" 2>&1)"; rc=$?
    if [ "$rc" -le 1 ]; then
        printf '  ok    %-34s %s\n' "$name" "$(echo "$out" | grep -m1 -E 'verdict|AGREE|DISAGREE|runs/s' || true)"
    else
        printf '  FAIL  %-34s exit %s: %s\n' "$name" "$rc" "$(echo "$out" | tail -3 | tr '\n' ' ')"
        failed=$((failed + 1))
    fi
}
with_precision() { # family precision steps → case file on $DEV (every command then runs there)
    "$BIN" example --family "$1" | python3 -c "
import json, sys
c = json.load(sys.stdin)
c['device'] = '$DEV'
c['precision'] = {'f32': {'kind': 'f32'}, 'bf16': {'kind': 'bf16'}, 'f16': {'kind': 'f16'}}['$2']
c['steps'] = $3
print(json.dumps(c))" >"$WORK/$1-$2.json"
    echo "$WORK/$1-$2.json"
}
seconds() { # seconds COMMAND... → the wall time of a command that exits 0 or 1
    python3 -c '
import subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
print(f"{time.perf_counter() - t:.4f}" if rc <= 1 else "nan")' "$@"
}

echo "== device (step 5: suspect the hardware)"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,compute_cap,temperature.gpu,power.draw \
    --format=csv 2>&1 || echo "nvidia-smi unavailable"
nproc; free -g | head -2

echo "== every family, forward and backward on $DEV"
for family in cnn transformer rnn; do
    for precision in f32 bf16 f16; do
        # candle has no bf16 convolution on CPU, but CUDA does: all nine run.
        case_file="$(with_precision "$family" "$precision" 20)"
        check "run $family $precision" "$BIN" run "$case_file"
    done
    check "gradcheck $family (f64)" "$BIN" gradcheck "$WORK/$family-f32.json"
done

echo "== differential: cpu vs $DEV"
for family in cnn transformer rnn; do
    check "diff $family f32" "$BIN" diff "$WORK/$family-f32.json" --devices "cpu,$DEV"
    "$BIN" diff "$WORK/$family-f32.json" --devices "cpu,$DEV" | sed -n 's/^/      /p' | grep -E "max relative|first disagreement|non-finite" || true
done
check "diff transformer bf16" "$BIN" diff "$WORK/transformer-bf16.json" --devices "cpu,$DEV"

echo "== commands on $DEV"
check "diagnose transformer f16" "$BIN" diagnose "$WORK/transformer-f16.json"
check "minimize transformer f16" "$BIN" minimize "$WORK/transformer-f16.json" --max-runs 40 --out "$WORK/repro.json"
[ -f "$WORK/repro.json" ] && check "replay reproducer" "$BIN" replay "$WORK/repro.json"
check "run --dump" "$BIN" run "$WORK/transformer-f16.json" --dump "$WORK/dump"
[ -d "$WORK/dump" ] && check "replay dump" "$BIN" replay "$WORK/dump"

echo "== the probe's cost per step on $DEV (cnn, f32): steps 20 to 220, with and without it"
for steps in 20 220; do with_precision cnn f32 "$steps" >/dev/null; cp "$WORK/cnn-f32.json" "$WORK/cnn-$steps.json"; done
t=()
for args in "" "--no-probe"; do
    for steps in 20 220; do t+=("$(seconds "$BIN" run "$WORK/cnn-$steps.json" $args)"); done
done
python3 -c "
import sys
a, b, c, d = map(float, sys.argv[1:])
probe, bare = (b - a) / 200, (d - c) / 200
share = (probe - bare) / bare
print(f'  step {1e3 * probe:.2f} ms with the probe, {1e3 * bare:.2f} ms without: the probe is {100 * share:+.1f}% of a step')
sys.exit(0 if share <= 0.05 else 1)" "${t[@]}" && echo "  ok    probe at most 5% of a cnn step" \
    || { echo "  FAIL  probe at most 5% of a cnn step"; failed=$((failed + 1)); }

echo "== campaign runs per second (clean data, $BUDGET each, 4 jobs both)"
check "fuzz $DEV jobs 4" "$BIN" fuzz --device "$DEV" --clean-data --budget "$BUDGET" --jobs 4 --seed 3 \
    --minimize-runs 1 --quiet --out "$WORK/gpu-campaign"
check "fuzz cpu jobs 4" "$BIN" fuzz --clean-data --budget "$BUDGET" --jobs 4 --seed 3 \
    --minimize-runs 1 --quiet --out "$WORK/cpu-campaign"
python3 -c "
import json, sys
g, c = (json.load(open(f'$WORK/{d}/summary.json')) for d in ('gpu-campaign', 'cpu-campaign'))
ratio = g['runs_per_s'] / c['runs_per_s']
print('  placed:', g.get('runs_by_device') or 'every run on one device', f'; runs/s {ratio:.3f}x the CPU campaign\'s')
sys.exit(0 if ratio >= 0.95 else 1)" 2>/dev/null && echo "  ok    $DEV campaign as fast as the CPU's (within 5%)" \
    || { echo "  FAIL  $DEV campaign as fast as the CPU's (within 5%)"; failed=$((failed + 1)); }
for d in gpu-campaign cpu-campaign; do
    python3 -c "
import collections, json
s = json.load(open('$WORK/$d/summary.json'))
print('  $d:', s['runs_this_session'], 'runs,', round(s['runs_per_s'], 1), 'runs/s')
errors = collections.Counter()
for line in open('$WORK/$d/journal.jsonl'):
    r = json.loads(line)
    if r.get('verdict') in ('error', 'panic', 'crash'):
        errors[(r['family'], r['precision'], ((r.get('message') or '').splitlines() or [''])[0][:160])] += 1
for (family, precision, message), n in errors.most_common(10):
    print(f'    {n} x error ({family} {precision}): {message}')" 2>/dev/null || true
done

echo "== lr-table on $DEV"
check "lr-table transformer adam" "$BIN" lr-table --family transformer --optimizer adam --seeds 2 \
    --device "$DEV" --quiet --out "$WORK/lr.md"
[ -f "$WORK/lr.md" ] && tail -4 "$WORK/lr.md"

echo "== $failed failed checks"
exit "$failed"
