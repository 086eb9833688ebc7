#!/usr/bin/env python3
"""A sharded campaign under a real scheduler: a Slurm job array, one shard
SIGKILLed and requeued, then `nanhunt merge`, compared with the same
campaign run in one process.

  python3 scripts/slurm-campaign.py --binary target/debug/nanhunt
  python3 scripts/slurm-campaign.py --runs 240 --shards 4 --seed 3 --keep /tmp/slurm-run

It starts a one-node cluster (`scripts/slurm-cluster.sh`, which installs
slurm-wlm and munge from Debian's packages when they are missing), then:

1. runs the campaign in one process (`nanhunt fuzz --runs R --seed S
   --mutation-rate 0`: every case a function of seed and index alone);
2. submits `sbatch --array=0-(N-1)`, each array task running shard
   `$SLURM_ARRAY_TASK_ID/N` with `--resume` into its own directory;
3. once one shard has journaled some runs, SIGKILLs it through Slurm
   (`scancel --signal=KILL --full`), waits for Slurm to record it failed,
   and requeues it (`scontrol requeue`): the rerun resumes its journal;
4. merges the shard directories (`nanhunt merge`) and checks that the
   merged campaign equals the one-process one: the same runs (every field
   but the wall time), each index once, the same signatures with the same
   counts and first indices, the same stable/unstable/error counts, and a
   reproducer for every signature that replays with its signature.

Exit 0 when every check holds; prints the figures and the wall time.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def fail(message):
    print(f"slurm-campaign: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def entries(directory):
    path = directory / "journal.jsonl"
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a torn last line after a kill: the resume cuts it
    return out


def runs_by_index(journal):
    """Index -> the run entry without its wall time (the one field that differs)."""
    out = {}
    for e in journal:
        if e["event"] == "run":
            e = dict(e)
            e.pop("millis")
            out.setdefault(e["index"], []).append(e)
    return out


def slurm(env, *args, check=True):
    done = subprocess.run(list(args), env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        fail(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def task_state(env, job, task):
    """The array task's JobState (and its restart count), from scontrol."""
    text = slurm(env, "scontrol", "-o", "show", "job", f"{job}_{task}", check=False)
    fields = dict(f.split("=", 1) for f in text.split() if "=" in f)
    return fields.get("JobState", "UNKNOWN"), int(fields.get("Restarts", "0"))


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    fail(f"timed out after {timeout} s waiting for {what}")


def summary_view(directory):
    s = json.loads((directory / "summary.json").read_text())
    sigs = {x["slug"]: (x["count"], x["first_index"]) for x in s["signatures"]}
    counts = {k: s[k] for k in ("runs", "stable", "unstable", "rejected", "errors", "timeouts")}
    return counts, sigs, {x["slug"]: x["reproducer"] for x in s["signatures"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=str(ROOT / "target/debug/nanhunt"))
    p.add_argument("--runs", type=int, default=160)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--victim", type=int, default=1, help="the array task that is killed and requeued")
    p.add_argument("--keep", help="work in this directory and keep it (default: a temp directory, removed)")
    args = p.parse_args()
    if args.shards < 2 or args.runs % args.shards:
        fail(f"--runs {args.runs} must be a multiple of --shards {args.shards} (at least 2)")
    if not 0 <= args.victim < args.shards:
        fail(f"--victim {args.victim} is not an array task of 0..{args.shards}")
    binary = pathlib.Path(args.binary).resolve()
    if not binary.is_file():
        fail(f"no nanhunt binary at {binary} (build it first)")
    work = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="nanhunt-slurm-")).resolve()
    if args.keep:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    state = work / "slurm"
    cluster = ["bash", str(ROOT / "scripts/slurm-cluster.sh")]
    started = time.monotonic()
    subprocess.run(cluster + ["up", str(state)], check=True)
    env = dict(os.environ, SLURM_CONF=str(state / "slurm.conf"))
    try:
        check(args, binary, work, env)
    finally:
        subprocess.run(cluster + ["down", str(state)], check=False)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"slurm-campaign: ok in {time.monotonic() - started:.1f} s")


def campaign_args(args, out, runs):
    # Mutation off: every case is a function of (seed, index) alone, so the
    # shards run exactly the one process's cases (with mutation on, each
    # shard mutates around its own findings).
    return ["fuzz", "--runs", str(runs), "--seed", str(args.seed), "--mutation-rate", "0",
            "--quiet", "--out", str(out)]


def check(args, binary, work, env):
    t0 = time.monotonic()
    one = work / "one-process"
    done = subprocess.run([str(binary)] + campaign_args(args, one, args.runs), capture_output=True, text=True)
    if done.returncode not in (0, 1):
        fail(f"the one-process campaign exited {done.returncode}: {done.stderr}")
    print(f"one process: {args.runs} runs in {time.monotonic() - t0:.1f} s")

    shards = work / "shards"
    logs = work / "logs"
    shards.mkdir()
    logs.mkdir()
    # Exit 1 (new findings) is success for a shard; anything else fails the task.
    task = work / "shard.sbatch"
    shard_dir = f"{shards}/shard-$SLURM_ARRAY_TASK_ID"
    # A shard's --runs counts its own runs (indices I, I+N, ...).
    per_shard = args.runs // args.shards
    command = " ".join([str(binary)] + campaign_args(args, shard_dir, per_shard))
    task.write_text(
        "#!/bin/bash\n"
        f"{command} --shard $SLURM_ARRAY_TASK_ID/{args.shards} --resume\n"
        "rc=$?\n"
        '[ "$rc" -eq 1 ] && exit 0\n'
        "exit $rc\n"
    )
    t1 = time.monotonic()
    job = slurm(
        env, "sbatch", "--parsable", f"--array=0-{args.shards - 1}", "--cpus-per-task=1",
        "--requeue", "--open-mode=append", "--job-name=nanhunt-fuzz",
        f"--output={logs}/%A_%a.out", str(task),
    ).strip().split(";")[0]
    print(f"submitted job array {job} ({args.shards} shards)")

    victim = shards / f"shard-{args.victim}"

    def victim_ran_some():
        try:
            n = len(runs_by_index(entries(victim)))
        except OSError:
            return False
        if n >= per_shard:
            fail(f"shard {args.victim} finished its {n} runs before it could be killed (raise --runs)")
        return n >= 3 and task_state(env, job, args.victim)[0] == "RUNNING"

    wait_for(f"shard {args.victim} to journal runs", victim_ran_some, 120)
    slurm(env, "scancel", "--signal=KILL", "--full", f"{job}_{args.victim}")
    wait_for(
        f"Slurm to record shard {args.victim} dead",
        lambda: task_state(env, job, args.victim)[0] in ("FAILED", "CANCELLED", "NODE_FAIL"),
        60,
    )
    killed_at = len(runs_by_index(entries(victim)))
    print(f"killed shard {args.victim} after {killed_at} of its {per_shard} runs; requeued")
    slurm(env, "scontrol", "requeue", f"{job}_{args.victim}")

    def all_done():
        states = [task_state(env, job, t)[0] for t in range(args.shards)]
        if any(s in ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL") for s in states):
            logs_text = "".join(f.read_text() for f in sorted(logs.iterdir()))
            fail(f"array tasks ended {states}; logs:\n{logs_text}")
        return all(s == "COMPLETED" for s in states)

    wait_for("every array task to complete", all_done, 600)
    state, restarts = task_state(env, job, args.victim)
    if restarts < 1:
        fail(f"shard {args.victim} shows {restarts} restarts: it was not requeued")
    print(f"job array done in {time.monotonic() - t1:.1f} s (shard {args.victim} restarted {restarts}x)")

    # The requeued shard resumed: its second session ran only what the first
    # had not journaled, and no run is journaled twice.
    log = (logs / f"{job}_{args.victim}.out").read_text()
    resumed = re.search(rf"{per_shard} runs \((\d+) this session", log)
    if not resumed or int(resumed.group(1)) != per_shard - killed_at:
        fail(f"shard {args.victim} did not resume its journal ({killed_at} runs before the kill); its log:\n{log}")
    journal = entries(victim)
    twice = [i for i, r in runs_by_index(journal).items() if len(r) > 1]
    if twice:
        fail(f"shard {args.victim} journaled runs {twice} twice")

    merged = work / "merged"
    done = subprocess.run(
        [str(binary), "merge"] + [str(shards / f"shard-{t}") for t in range(args.shards)] + ["--out", str(merged)],
        capture_output=True, text=True,
    )
    if done.returncode not in (0, 1):
        fail(f"nanhunt merge exited {done.returncode}: {done.stderr}")
    compare(binary, one, merged)


def compare(binary, one, merged):
    a, b = runs_by_index(entries(one)), runs_by_index(entries(merged))
    if sorted(a) != sorted(b):
        fail(f"run indices differ: one process {sorted(a)}, merged {sorted(b)}")
    differ = [i for i in a if a[i] != b[i]]
    if differ:
        i = differ[0]
        fail(f"{len(differ)} runs differ, first {i}:\n  one process {a[i]}\n  merged      {b[i]}")
    (ca, sa, _), (cb, sb, repro) = summary_view(one), summary_view(merged)
    if ca != cb:
        fail(f"counts differ: one process {ca}, merged {cb}")
    if sa != sb:
        fail(f"signatures differ:\n  one process {sa}\n  merged      {sb}")
    for slug, file in repro.items():
        if file is None:
            fail(f"signature {slug} has no reproducer in the merged campaign")
        done = subprocess.run([str(binary), "replay", str(merged / "repro" / file)], capture_output=True, text=True)
        if done.returncode != 0:
            fail(f"reproducer {file} does not replay: {done.stdout}{done.stderr}")
    print(f"merged = one process: {len(a)} runs, {ca['unstable']} unstable, {len(sa)} signatures, "
          f"{len(repro)} reproducers replay")


if __name__ == "__main__":
    main()
