#!/usr/bin/env python3
"""Function lengths in the step engine and its drivers.

    scripts/check-fn-lengths.py [SRC_DIR]     (default: harness/src)

No function over MAX_LINES lines in the runner, the guard, the checks,
diagnose, the explanations or the hunt (tests excluded), and each driver's step under STEP_LINES: the
step is a short chain of phases, and a long one is a second engine
growing. Prints the offenders and exits 1; `--all` lists every function
over the limit in the whole crate, for information.
"""
import os
import re
import sys

MAX_LINES = 90
STEP_LINES = 40
CHECKED = ["runner", "guard", "checks", "diagnose", "explain", "hunt"]
# (file, function) pairs held to STEP_LINES.
STEPS = [("runner/mod.rs", "step"), ("guard/mod.rs", "step")]


def functions(path):
    """(name, first line, line count) of each fn outside test modules."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, in_tests, depth_tests = [], False, 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"\s*#\[cfg\(test\)\]", line):
            # Skip the test module that follows.
            j = i + 1
            while j < len(lines) and "{" not in lines[j]:
                j += 1
            depth = 0
            k = j
            while k < len(lines):
                depth += lines[k].count("{") - lines[k].count("}")
                if depth <= 0 and k > j - 1 and "{" in "".join(lines[j:k + 1]):
                    break
                k += 1
            i = k + 1
            continue
        m = re.match(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?fn\s+(\w+)", line)
        if m:
            name = m.group(4)
            depth, j, opened = 0, i, False
            while j < len(lines):
                text = re.sub(r"//.*", "", lines[j])
                text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
                depth += text.count("{") - text.count("}")
                opened = opened or "{" in text
                if opened and depth <= 0:
                    break
                if not opened and text.rstrip().endswith(";"):
                    break  # a declaration without a body
                j += 1
            out.append((name, i + 1, j - i + 1))
        i += 1
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src = args[0] if args else "harness/src"
    show_all = "--all" in sys.argv
    problems = []
    for root, _, names in os.walk(src):
        for n in sorted(names):
            if not n.endswith(".rs") or n == "tests.rs":
                continue
            path = os.path.join(root, n)
            rel = os.path.relpath(path, src)
            checked = rel.split(os.sep)[0] in CHECKED
            for name, line, count in functions(path):
                limit = STEP_LINES if (rel, name) in STEPS else MAX_LINES
                if count > limit and (checked or show_all):
                    problems.append(f"{rel}:{line}: fn {name} is {count} lines (limit {limit})")
    for p in problems:
        print(p)
    checked_problems = [p for p in problems if p.split(os.sep)[0] in CHECKED or
                        p.split(":")[0].split("/")[0] in CHECKED]
    if checked_problems:
        sys.exit(1)
    print(f"no function over {MAX_LINES} lines in {', '.join(CHECKED)}; "
          f"the drivers' steps under {STEP_LINES}")


if __name__ == "__main__":
    main()
