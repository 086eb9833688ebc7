#!/usr/bin/env bash
# lr-table's thresholds against a dense grid of the same LRs (3 families ×
# 5 optimizers, small size): how many equal the first unstable grid LR, and
# the runs spent against the grid's. Minutes on 2 cores; kept out of CI.
# Usage: bench/lr_table_vs_grid.sh [seeds] [min_lr] [max_lr]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -q -p nanhunt-bench-tools --bin lr_table_vs_grid -- "$@"
