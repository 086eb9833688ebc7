#!/bin/bash -eu
# Builds every fuzz target in fuzz/ (release, with debug assertions) and puts each binary, with its seed
# corpus as <target>_seed_corpus.zip, into $OUT.
#
# Inside ClusterFuzzLite's image ($LIB_FUZZING_ENGINE set) cargo-fuzz gets
# the sanitizer flags from the image. Outside it (a local smoke test, and
# this repository's CI) it runs with nightly and no sanitizer, into
# fuzz/out unless $OUT is set:
#   bash .clusterfuzzlite/build.sh && fuzz/out/case_json -max_total_time=10 corpora/case_json
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/fuzz/out}"
mkdir -p "$OUT"
cd "$ROOT"

if [ -n "${LIB_FUZZING_ENGINE:-}" ]; then
    cargo fuzz build
else
    # cargo-fuzz builds with one codegen unit by default, so each crate
    # compiles on one core: 16 took a cold build of the five targets from
    # 546 s to 434 s on 2 cores, for slightly slower runs (a smoke test's
    # trade; NANHUNT_FUZZ_CODEGEN_UNITS=1 for a long campaign).
    cargo +nightly fuzz build --sanitizer "${NANHUNT_SANITIZER:-none}" \
        --codegen-units "${NANHUNT_FUZZ_CODEGEN_UNITS:-16}"
fi

BIN="fuzz/target/x86_64-unknown-linux-gnu/release"
for target in $(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^nanhunt-fuzz$'); do
    cp "$BIN/$target" "$OUT/"
    rm -f "$OUT/${target}_seed_corpus.zip"
    (cd "corpora/$target" && python3 -m zipfile -c "$OUT/${target}_seed_corpus.zip" *)
    if [ "$target" != case_json ]; then
        # Byte-decoded targets need ~50-250 bytes from the start.
        printf '[libfuzzer]\nmax_len = 256\nlen_control = 0\n' >"$OUT/$target.options"
    fi
    echo "built $OUT/$target"
done
