#!/usr/bin/env python3
"""Counts the library's public items: what a user can name.

    scripts/public-items.py [SRC_DIR]     (default: harness/src)

Walks the module tree from lib.rs through `pub mod` declarations only (a
private or `pub(crate)` module's items cannot be named outside the crate),
and counts the `pub` (not `pub(crate)`/`pub(super)`) fn, struct, enum,
trait, type, const, static and mod items in each, outside test modules,
methods included. Prints the totals by kind and the public modules.
"""
import os
import re
import sys

ITEM = re.compile(r"^\s*pub\s+(?:unsafe\s+|const\s+|async\s+)*(fn|struct|enum|trait|type|const|static|mod)\s+(\w+)")


def strip_tests(text):
    """The text without `#[cfg(test)]` modules."""
    out, i = [], 0
    lines = text.split("\n")
    while i < len(lines):
        if re.match(r"\s*#\[cfg\(test\)\]", lines[i]):
            j, depth, opened = i + 1, 0, False
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                opened = opened or "{" in lines[j]
                if opened and depth <= 0:
                    break
                j += 1
            i = j + 1
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def module_file(dir_, name):
    for p in (os.path.join(dir_, name + ".rs"), os.path.join(dir_, name, "mod.rs")):
        if os.path.exists(p):
            return p
    return None


def walk(path, dir_, counts, mods, prefix):
    text = strip_tests(open(path, encoding="utf-8").read())
    for line in text.split("\n"):
        m = ITEM.match(line)
        if not m:
            continue
        kind, name = m.groups()
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "mod":
            mods.append(prefix + name)
            if line.rstrip().endswith(";"):
                sub = module_file(dir_, name)
                if sub:
                    sub_dir = os.path.join(dir_, name)
                    walk(sub, sub_dir, counts, mods, prefix + name + "::")


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "harness/src"
    counts, mods = {}, []
    walk(os.path.join(src, "lib.rs"), src, counts, mods, "")
    total = sum(counts.values())
    print(f"{total} public items: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{len(mods)} public modules: " + " ".join(mods))


main()
