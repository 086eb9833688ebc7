#!/usr/bin/env python3
"""SIGKILLs hunts at random moments and checks that no reproducer is lost.

Runs a user binary's `hunt` (one built with `nanhunt::cli::main_with`, such
as the `user_model` example) again and again on one `--out`, killing most
of them a random moment after they start. After each: the output holds
exactly one reproducer per signature it held before, and each replays
(`BINARY replay DIR`). After the last, one uninterrupted hunt leaves no
temp name behind.

  cargo build --example user_model
  python3 scripts/kill-hunts.py --binary target/debug/examples/user_model --hunts 100

Exit 0 when every check holds; prints the figures.
"""
import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time


def reproducers(out):
    return sorted(n for n in os.listdir(os.path.join(out, "reproducers")) if not n.startswith("."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/debug/examples/user_model")
    ap.add_argument("--hunts", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    exe = os.path.abspath(args.binary)
    work = tempfile.mkdtemp(prefix="nanhunt-hunt-kills-")
    out = os.path.join(work, "hunt")
    hunt = [exe, "hunt", "--out", out, "--no-drift"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    started = time.time()
    subprocess.run(hunt, check=False, **quiet)
    took = time.time() - started
    want = reproducers(out)
    if not want:
        sys.exit("the first hunt wrote no reproducer: nothing to replace")
    rng = random.Random(args.seed)
    killed = lost = 0
    for _ in range(args.hunts):
        p = subprocess.Popen(hunt, **quiet)
        time.sleep(rng.uniform(0.3, 1.5) * took)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
        have = reproducers(out)
        replays = all(
            subprocess.run([exe, "replay", os.path.join(out, "reproducers", n)], **quiet).returncode == 0
            for n in have
        )
        lost += have != want or not replays
    subprocess.run(hunt, check=False, **quiet)
    temps = [n for d in (out, os.path.join(out, "reproducers")) for n in os.listdir(d) if ".tmp-" in n]
    print(f"hunts: {args.hunts}, killed: {killed}, a hunt {took * 1000:.0f} ms")
    print(f"reproducers lost or not replaying after a hunt: {lost}; temp names left: {len(temps)}")
    sys.exit(0 if lost == 0 and not temps else 1)


if __name__ == "__main__":
    main()
