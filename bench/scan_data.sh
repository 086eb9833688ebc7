#!/usr/bin/env bash
# scan-data throughput and peak memory on a generated dataset of about 1 GiB
# (1 048 576 samples x 256 f32 features, safetensors):
#   bash bench/scan_data.sh [SAMPLES] [FEATURES]
# Prints the file size, the wall time, MB/s and the scan's peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
samples=${1:-1048576}
features=${2:-256}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cargo build --quiet --release -p nanhunt --bin nanhunt --example make_dataset
target/release/examples/make_dataset "$dir/big.safetensors" "$samples" "$features"
bytes=$(stat -c %s "$dir/big.safetensors")
# Drop nothing from the page cache: the figure is the scan's own speed on a
# file the OS has cached (the first read from disk adds the disk's speed).
cat "$dir/big.safetensors" > /dev/null
start=$(date +%s.%N)
/usr/bin/time -f "%M" -o "$dir/rss" target/release/nanhunt scan-data "$dir/big.safetensors" \
    --classes 10 --report json --out "$dir/scan.json" || test $? -eq 1
end=$(date +%s.%N)
python3 - "$bytes" "$start" "$end" "$(tail -1 "$dir/rss")" <<'PY'
import sys
size, start, end, rss = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
secs = end - start
print(f"file {size / 1e6:.0f} MB, scan {secs:.2f} s, {size / 1e6 / secs:.0f} MB/s, peak RSS {rss / 1024:.0f} MiB")
PY
