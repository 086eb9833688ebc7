#!/usr/bin/env python3
"""Paired timing for the side-by-side benchmark: nanhunt, PyTorch eager and
PyTorch compiled each keep one model alive (their `serve` modes) and take
turns in short chunks of steps, so that a slow spell of a shared machine
falls on all three alike instead of on whichever ran in it. Each chunk's
ratio is the median step of one framework over the median step of
nanhunt's chunk beside it; the figure is the median over the chunks.

  paired.py NANHUNT_EXAMPLE PYTHON FAMILY CHUNKS STEPS_PER_CHUNK

Prints one JSON object: the family, each framework's median ms per step
over all its chunks, the per-chunk ratios, and why compiled is missing
where torch.compile could not compile the model here.
"""
import json
import os
import statistics
import subprocess
import sys


def start(cmd, env):
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env, bufsize=1)
    first = json.loads(p.stdout.readline() or '{"error": "exited before it was ready"}')
    if "error" in first:
        p.stdin.close()
        p.wait()
        return None, first["error"]
    return p, None


def chunk(p, steps):
    p.stdin.write(f"{steps}\n")
    p.stdin.flush()
    line = p.stdout.readline()
    if not line:
        raise SystemExit(f"a server exited mid-run: {p.args}")
    return json.loads(line)["times"]


def main():
    example, python, family, chunks, per = sys.argv[1:6]
    chunks, per = int(chunks), int(per)
    one_thread = dict(os.environ, RAYON_NUM_THREADS="1", OMP_NUM_THREADS="1")
    here = os.path.dirname(os.path.abspath(__file__))
    torch_cmd = [python, os.path.join(here, "pytorch_bench.py"), "serve", family]
    servers = {}
    servers["nanhunt"], _ = start([example, "serve", family], one_thread)
    servers["eager"], _ = start(torch_cmd + ["eager"], one_thread)
    servers["compiled"], why = start(torch_cmd + ["compiled"], one_thread)
    if servers["nanhunt"] is None or servers["eager"] is None:
        raise SystemExit(f"{family}: a server did not start")
    names = [n for n, p in servers.items() if p is not None]
    medians = {n: [] for n in names}
    for c in range(chunks):
        # Who goes first rotates, so none always finds the caches another left.
        order = names[c % len(names):] + names[:c % len(names)]
        for n in order:
            medians[n].append(statistics.median(chunk(servers[n], per)))
    for p in servers.values():
        if p is not None:
            p.stdin.close()
            p.wait()
    ratios = {n: [m / h for m, h in zip(medians[n], medians["nanhunt"])]
              for n in names if n != "nanhunt"}
    print(json.dumps({
        "family": family,
        "ms_per_step": {n: 1e3 * statistics.median(m) for n, m in medians.items()},
        "chunk_ratios": ratios,
        "compile_error": why,
    }), flush=True)


if __name__ == "__main__":
    main()
