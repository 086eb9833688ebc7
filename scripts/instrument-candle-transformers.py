#!/usr/bin/env python3
"""`#[nanhunt::instrument]` on every function of candle-transformers.

    scripts/instrument-candle-transformers.py [--keep]

Copies the candle-transformers source the workspace resolves (from cargo's
registry, after `cargo fetch`) into target/instrumented-ct/, puts the
attribute on every function with a body (about 3,400: every model, layer
and helper), and checks that the crate still compiles with no new error,
then runs two of its models (scripts/instrumented-ct/: Llama and BERT)
traced and untraced: the same bits, and their ops recorded. A change of the
attribute that breaks code people write shows here. Nothing of
candle-transformers is kept in this repository; its copy is scratch
(removed unless --keep).
"""
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "target", "instrumented-ct")
PROBES = os.path.join(ROOT, "scripts", "instrumented-ct")
FN = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(unsafe\s+)?(async\s+)?fn\s+\w+")


def source_dir():
    meta = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1"], cwd=ROOT))
    for p in meta["packages"]:
        if p["name"] == "candle-transformers":
            return os.path.dirname(p["manifest_path"])
    sys.exit("candle-transformers is not in the workspace's dependencies")


def has_body(lines, i):
    """Whether the fn item starting at line i has a body (not `;`)."""
    text = "\n".join(lines[i:i + 40])
    depth = 0
    for ch in text[text.index("fn"):]:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        elif ch == "{" and depth <= 0:
            return True
        elif ch == ";" and depth <= 0:
            return False
    return False


def instrument(path):
    lines = open(path).read().split("\n")
    out, n = [], 0
    for i, line in enumerate(lines):
        m = FN.match(line)
        previous = lines[i - 1].strip() if i else ""
        if m and "const fn" not in line and has_body(lines, i) and previous != "#[test]":
            out.append(m.group(1) + "#[nanhunt::instrument]")
            n += 1
        out.append(line)
    open(path, "w").write("\n".join(out))
    return n


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    shutil.copytree(source_dir(), WORK)
    count = 0
    for base, _, files in os.walk(os.path.join(WORK, "src")):
        count += sum(instrument(os.path.join(base, f)) for f in files if f.endswith(".rs"))
    manifest = os.path.join(WORK, "Cargo.toml")
    text = open(manifest).read().replace("autoexamples = false", "autoexamples = true")
    text += ('\n[dependencies.nanhunt]\npath = "%s"\ndefault-features = false\n'
             '\n[dev-dependencies.anyhow]\nversion = "1"\n\n[workspace]\n'
             % os.path.join(ROOT, "harness"))
    open(manifest, "w").write(text)
    # The workspace's lock: the same versions of every dependency.
    shutil.copy(os.path.join(ROOT, "Cargo.lock"), os.path.join(WORK, "Cargo.lock"))
    shutil.rmtree(os.path.join(WORK, "examples"), ignore_errors=True)
    shutil.copytree(PROBES, os.path.join(WORK, "examples"))
    print(f"{count} functions instrumented")
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(ROOT, "target", "instrumented-ct-target"))
    run = lambda *args: subprocess.run(["cargo", *args], cwd=WORK, env=env, check=True)
    run("check", "--lib", "--quiet")
    print("candle-transformers compiles with every function instrumented")
    for probe in sorted(os.listdir(PROBES)):
        run("run", "--quiet", "--example", probe[:-3])
    if "--keep" not in sys.argv:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
