#!/usr/bin/env python3
"""Checks that nothing in the nanhunt crate imports upward.

    scripts/check-layers.py [SRC_DIR]     (default: harness/src)

Every file of the crate belongs to one floor (LAYERS below, bottom first,
the order docs/ARCHITECTURE.md draws). A file may use what is on its own
floor or below; a `crate::...` path (in a `use` or an expression) that
names a file on a higher floor is printed with the names it takes, and the
script exits 1. Test code (`tests.rs`, `#[cfg(test)] mod ... { }`) is left
out: tests may reach anywhere. A file no floor names is an error too, so a
new module must say where it lives.
"""
import os
import re
import sys

# Bottom first. A module path covers its submodules (`spec` is spec/*).
LAYERS = [
    ("base", ["error", "floats", "format", "rng", "files", "progress", "kernels", "opkind", "instrument"]),
    ("spec", ["spec"]),
    ("building blocks", ["device", "parallel", "probe", "data", "augment", "optim", "scaler",
                         "backward"]),
    ("findings", ["finding", "outcome"]),
    ("checks and models", ["checks", "intervention", "models", "losses", "state"]),
    ("reading records", ["explain", "coverage", "trace", "rules"]),
    ("localization", ["localize"]),
    ("scenes", ["scene", "dump", "repro", "record"]),
    ("drivers of a step", ["runner", "guard"]),
    ("whole runs", ["fidelity", "training"]),
    ("drivers of many runs", ["replay", "differential", "gradcheck", "minimize", "strategy", "hunt",
                              "lrtable", "diagnose", "regression"]),
    ("campaigns and reports", ["journal", "report", "campaign", "merge"]),
    ("fuzz targets' logic", ["fuzzing"]),
    ("entry points", ["lib", "main", "cli"]),
]


def floor_of(mod):
    for i, (_, prefixes) in enumerate(LAYERS):
        if mod[0] in prefixes or (mod == ("lib",) and "lib" in prefixes):
            return i
    return None


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def expand(path):
    m = re.match(r"([\w:]*?)::?\{(.*)\}$", path, flags=re.S)
    if not m:
        return [path]
    head, body = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    res = []
    for p in parts:
        p = p.strip()
        if p:
            res += expand(head + "::" + p if head else p)
    return res


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "harness/src"
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs") and n != "tests.rs":
                p = os.path.join(root, n)
                rel = os.path.relpath(p, src)[:-3].split(os.sep)
                if rel[-1] in ("mod", "lib", "main") and len(rel) > 1:
                    rel = rel[:-1]
                files[tuple(rel)] = p
    problems = []
    for mod, path in sorted(files.items()):
        mine = floor_of(mod)
        if mine is None:
            problems.append(f"{path}: no floor in scripts/check-layers.py names `{mod[0]}`")
            continue
        text = strip(open(path, encoding="utf-8").read())
        refs = []
        for m in re.finditer(r"\buse\s+crate::([^;]+);", text, flags=re.S):
            refs += expand(re.sub(r"\s+", "", m.group(1)))
        for m in re.finditer(r"\bcrate::((?:\w+::)*\w+)", text):
            refs.append(m.group(1))
        for ref in refs:
            target = ref.split("::")[0]
            theirs = floor_of((target,))
            if theirs is not None and theirs > mine:
                problems.append(
                    f"{path} (floor `{LAYERS[mine][0]}`) uses crate::{ref} "
                    f"(floor `{LAYERS[theirs][0]}`)"
                )
    for p in sorted(set(problems)):
        print(p)
    if problems:
        sys.exit(1)
    print(f"no upward imports among {len(files)} files under {src}")


if __name__ == "__main__":
    main()
