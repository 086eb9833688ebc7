#!/usr/bin/env python3
"""Writes the small, checked-in seed corpora in corpora/<target>/.

The byte targets decode their input with `arbitrary`, so seeds are
deterministic pseudo-random byte strings (most decode to valid inputs);
`case_json` starts from the checked-in test cases, the overflow regression
and structured seeds (a 0 byte, then edit choices). Run from the repository
root: python3 fuzz/seed_corpora.py
"""
import pathlib
import random
import shutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
BYTE_TARGETS = {"case_runs": 12, "safe_envelope": 12, "losses": 16, "augmentations": 16}

for target, count in BYTE_TARGETS.items():
    out = ROOT / "corpora" / target
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(target)
    for i in range(count):
        size = rng.choice([64, 128, 256])
        (out / f"seed-{i:02}").write_bytes(bytes(rng.randrange(256) for _ in range(size)))

out = ROOT / "corpora" / "case_json"
out.mkdir(parents=True, exist_ok=True)
cases = ROOT / "tests" / "cases"
for path in sorted(cases.glob("valid/*.json")) + sorted(cases.glob("invalid/*.json"))[:9]:
    shutil.copy(path, out / f"{path.parent.name}-{path.name}")

# Structured seeds: a 0 byte, then the bytes that choose a base case and its
# edits (harness/src/fuzzing/json_edit.rs); most of what grows from them
# still parses as a case, so the fuzzer spends its time in validation.
rng = random.Random("case_json")
for i in range(12):
    (out / f"structured-{i:02}").write_bytes(bytes([0] + [rng.randrange(256) for _ in range(63)]))
