#!/usr/bin/env bash
# scan-data throughput and peak memory on a generated dataset of about 1 GiB
# (1 048 576 samples x 256 f32 features, safetensors):
#   bash bench/scan_data.sh [SAMPLES] [FEATURES] [ROUNDS]
# Each round times `nanhunt scan-data` on one thread and on all cores, and,
# where Python has numpy and safetensors, numpy's plain isnan().any() plus
# per-feature min/max/mean/std on the same file (loading it, then on the
# array in memory), interleaved. Prints the wall time, MB/s and peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
samples=${1:-1048576}
features=${2:-256}
rounds=${3:-3}
cores=$(nproc)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cargo build --quiet --release -p nanhunt --bin nanhunt -p nanhunt-bench-tools --bin make_dataset
target/release/make_dataset "$dir/big.safetensors" "$samples" "$features"
bytes=$(stat -c %s "$dir/big.safetensors")
echo "file $((bytes / 1000000)) MB, $samples samples x $features f32 features, $cores cores"
# Drop nothing from the page cache: the figure is the scan's own speed on a
# file the OS has cached (the first read from disk adds the disk's speed).
cat "$dir/big.safetensors" > /dev/null

scan() {
    local threads=$1 start end
    start=$(date +%s.%N)
    /usr/bin/time -f "%M" -o "$dir/rss" target/release/nanhunt scan-data "$dir/big.safetensors" \
        --classes 10 --threads "$threads" --report json --out "$dir/scan.$threads.json" || test $? -eq 1
    end=$(date +%s.%N)
    python3 -c "import sys; b, s, e, r = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]); \
print(f'nanhunt --threads {sys.argv[5]}: {e - s:.2f} s, {b / 1e6 / (e - s):.0f} MB/s, peak RSS {r / 1024:.0f} MiB')" \
        "$bytes" "$start" "$end" "$(tail -1 "$dir/rss")" "$threads"
}

numpy_scan() {
    if ! python3 -c "import numpy, safetensors.numpy" 2>/dev/null; then
        echo "numpy: not installed here (pip install numpy safetensors)"
        return
    fi
    /usr/bin/time -f "%M" -o "$dir/rss.np" python3 - "$dir/big.safetensors" "$bytes" <<'PY'
import sys, time
import numpy as np
from safetensors.numpy import load_file
path, size = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
x = load_file(path)["inputs"]
t1 = time.perf_counter()
bad = bool(np.isnan(x).any())
stats = x.min(axis=0), x.max(axis=0), x.mean(axis=0), x.std(axis=0)
t2 = time.perf_counter()
print(f"numpy: load {t1 - t0:.2f} s, isnan().any() + min/max/mean/std {t2 - t1:.2f} s "
      f"({size / 1e6 / (t2 - t1):.0f} MB/s in memory, {size / 1e6 / (t2 - t0):.0f} MB/s with the load)", end="")
PY
    echo ", peak RSS $(($(tail -1 "$dir/rss.np") / 1024)) MiB"
}

for round in $(seq "$rounds"); do
    echo "-- round $round"
    scan 1
    [ "$cores" -gt 1 ] && scan "$cores"
    numpy_scan
done
if [ "$cores" -gt 1 ]; then
    cmp -s "$dir/scan.1.json" "$dir/scan.$cores.json" && echo "reports on 1 and $cores threads: the same bytes" \
        || { echo "reports on 1 and $cores threads differ"; exit 1; }
fi
