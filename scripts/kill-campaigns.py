#!/usr/bin/env python3
"""SIGKILLs fuzz campaigns at random moments and checks that nothing is lost.

For each campaign seed: one uninterrupted reference run, then the same
campaign started, SIGKILLed (the main process, or one of its worker
children) at a random moment, resumed with --resume, killed again, ... and
finally resumed to completion. Then it checks:

- every run index is journaled exactly once (no duplicates, none missing);
- no finding is lost: every signature seen in a run has its finding entry
  and a reproducer (or a journaled reason there is none);
- one reproducer file per signature, and every one replays (`nanhunt replay`);
- no temp file is left, and no worker process outlives its campaign;
- with only the main process killed (--jobs 1), the journal's runs and the
  reproducer files are identical to the uninterrupted run's.

  python3 scripts/kill-campaigns.py --binary target/debug/nanhunt --campaigns 8 --kills 12
  python3 scripts/kill-campaigns.py --campaigns 4 --kills 12 --child-share 0 --seed 1

(the second kills only main processes, so every campaign is also compared
with its uninterrupted run).

Exit 0 when every check holds; prints the figures.
"""
import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def journal(d):
    path = d / "journal.jsonl"
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a torn last line: the next resume cuts it
    return entries


def runs(entries):
    out = {}
    for e in entries:
        if e["event"] == "run":
            e = dict(e)
            e.pop("millis")
            out.setdefault(e["index"], []).append(json.dumps(e, sort_keys=True))
    return out


def children(pid):
    found = set()
    try:
        for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
            try:
                found.update(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    except OSError:
        pass
    return sorted(found)


def alive(pids):
    """The processes among `pids` that still run (not gone, not zombies)."""
    out = []
    for pid in pids:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append(pid)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/debug/nanhunt")
    ap.add_argument("--campaigns", type=int, default=5)
    ap.add_argument("--kills", type=int, default=12, help="kills per campaign")
    ap.add_argument("--runs", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child-share", type=float, default=0.4,
                    help="share of kills that hit a worker child instead of the main process")
    args = ap.parse_args()
    binary = str(pathlib.Path(args.binary).resolve())
    rng = random.Random(args.seed)
    work = pathlib.Path(tempfile.mkdtemp(prefix="nanhunt-kills-"))
    base = ["fuzz", "--runs", str(args.runs), "--quiet", "--minimize-runs", "40"]
    failures = []
    totals = dict(kills=0, main=0, child=0, during_minimization=0, orphans=0,
                  lost=0, duplicates=0, replayed=0, signatures=0, compared=0, identical=0)

    for c in range(args.campaigns):
        seed = str(100 + c + args.seed * 1000)
        ref = work / f"ref-{c}"
        t0 = time.monotonic()
        subprocess.run([binary, *base, "--seed", seed, "--out", str(ref)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t_ref = time.monotonic() - t0
        out = work / f"killed-{c}"
        child_kills = 0
        kills = 0
        while kills < args.kills:
            resume = ["--resume"] if (out / "journal.jsonl").exists() else []
            p = subprocess.Popen([binary, *base, "--seed", seed, "--out", str(out), *resume],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.02, max(0.05, t_ref * 0.25)))
            if p.poll() is not None:
                break  # finished before the kill: nothing left to kill
            tail = journal(out)[-1:] if out.exists() else []
            minimizing = bool(tail) and tail[0]["event"] == "finding"
            kids = children(p.pid)
            if kids and rng.random() < args.child_share:
                os.kill(rng.choice(kids), signal.SIGKILL)
                child_kills += 1
                totals["child"] += 1
                kills += 1
                totals["kills"] += 1
                # The campaign goes on with a fresh worker; kill it too a little later.
                time.sleep(rng.uniform(0.02, max(0.05, t_ref * 0.25)))
            if p.poll() is not None:
                continue
            else:
                kids = children(p.pid)
                p.send_signal(signal.SIGKILL)
                p.wait()
                totals["main"] += 1
                # The parent-death signal ends its workers at once.
                deadline = time.monotonic() + 2
                while alive(kids) and time.monotonic() < deadline:
                    time.sleep(0.02)
                if alive(kids):
                    totals["orphans"] += 1
                    failures.append(f"campaign {c}: a worker outlived its campaign")
                    for w in alive(kids):
                        os.kill(w, signal.SIGKILL)
            kills += 1
            totals["kills"] += 1
            totals["during_minimization"] += int(minimizing)
        final = subprocess.run([binary, *base, "--seed", seed, "--out", str(out), "--resume"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if final.returncode not in (0, 1):
            failures.append(f"campaign {c}: the last resume exited {final.returncode}: {final.stderr}")
            continue

        got = journal(out)
        by_index = runs(got)
        dup = [i for i, v in by_index.items() if len(v) > 1]
        missing = sorted(set(range(args.runs)) - set(by_index))
        totals["duplicates"] += len(dup)
        if dup or missing:
            failures.append(f"campaign {c}: duplicated runs {dup}, missing runs {missing}")
        seen = {json.dumps(e["signature"], sort_keys=True) for e in got
                if e["event"] == "run" and e.get("signature")}
        findings = {json.dumps(e["signature"], sort_keys=True) for e in got if e["event"] == "finding"}
        settled = {json.dumps(e["signature"], sort_keys=True) for e in got
                   if e["event"] in ("reproducer", "unminimized")}
        lost = (seen - findings) | (findings - settled)
        totals["lost"] += len(lost)
        totals["signatures"] += len(findings)
        if lost:
            failures.append(f"campaign {c}: {len(lost)} findings lost: {sorted(lost)}")
        files = sorted(f.name for f in (out / "repro").iterdir()) if (out / "repro").exists() else []
        temps = [f for f in files if ".tmp-" in f] + [f.name for f in out.iterdir() if ".tmp-" in f.name]
        if temps:
            failures.append(f"campaign {c}: temp files left: {temps}")
        slugs = [f.rsplit("-", 1)[0] for f in files]
        if len(slugs) != len(set(slugs)):
            failures.append(f"campaign {c}: two reproducers for one signature: {files}")
        for f in files:
            r = subprocess.run([binary, "replay", str(out / "repro" / f)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode != 0:
                failures.append(f"campaign {c}: {f} does not replay (exit {r.returncode})")
            else:
                totals["replayed"] += 1
        if child_kills == 0:
            want = journal(ref)
            ref_files = sorted(f.name for f in (ref / "repro").iterdir()) if (ref / "repro").exists() else []
            totals["compared"] += 1
            if runs(want) != by_index or ref_files != files:
                failures.append(f"campaign {c}: differs from the uninterrupted run")
            else:
                totals["identical"] += 1
        print(f"campaign {c} (seed {seed}): {kills} kills ({child_kills} of workers), "
              f"{len(by_index)} runs, {len(findings)} signatures, {len(files)} reproducers", flush=True)

    print(f"kills: {totals['kills']} ({totals['main']} of the main process, {totals['child']} of workers, "
          f"{totals['during_minimization']} while minimizing)")
    print(f"findings lost: {totals['lost']}, duplicated runs: {totals['duplicates']}, "
          f"orphaned workers: {totals['orphans']}, reproducers replayed: {totals['replayed']}, "
          f"signatures: {totals['signatures']}")
    print(f"identical to the uninterrupted run (campaigns with only the main process killed): "
          f"{totals['identical']} of {totals['compared']}")
    for f in failures:
        print("FAIL:", f)
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
