#!/usr/bin/env python3
"""The framework mark of real findings checked against PyTorch.

Dumps the scene of every finding of a fresh campaign (RUNS generated cases,
no mutations) and of every reproducer in corpora/repro, re-runs each
failing step in PyTorch from the same parameters, optimizer state and
batch (scripts/pytorch_step.py says how a PyTorch user's step is
written), and compares what PyTorch did with the mark nanhunt printed:
`PyTorch would fail too` agrees when PyTorch's step fails, `candle-specific`
when it is healthy; `not judged` is counted apart.

Needs a Python with torch and safetensors (not CI):

  python scripts/pytorch-findings.py [--runs 300] [--seed 0] [--work DIR]

writes docs/pytorch-findings.csv and docs/PYTORCH-FINDINGS.md. With the
table it checks the PyTorch port, since a port that computed another model
would make the table moot: the loss PyTorch computes for each f32/f64
finding whose loss nanhunt saw finite must be nanhunt's, and every
campaign case turned f64 is run for two steps in both (the loss at step 0,
and at step 1 after each framework's own update, must agree).
"""
import argparse
import csv
import datetime
import json
import os
import subprocess
from collections import Counter
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
import pytorch_step  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = {"f64": 1e-9, "f32": 1e-4}


def sh(*cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, check=True, **kw)


def dump(case, out, at=None):
    """`nanhunt run CASE --dump OUT` (of step `at`, or of the failure), kept
    between runs; the scene and its tensors, or None where none was written."""
    if not (out / "scene.json").exists():
        at_step = ["--dump-at", str(at)] if at is not None else []
        r = subprocess.run([str(ROOT / "target/release/nanhunt"), "run", str(case), "--dump", str(out), *at_step],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        if r.returncode not in (0, 1):
            print(f"{case}: exit {r.returncode}: {r.stderr.strip()[:200]}", file=sys.stderr)
    if not (out / "scene.json").exists():
        return None
    return json.loads((out / "scene.json").read_text()), load_file(str(out / "scene.safetensors"))


def close(a, b, tol):
    return abs(a - b) <= tol * max(1.0, abs(a))


def described(failure):
    phase, stage, what = failure
    return f"{what} in {phase} at {stage}"


def dump_scenes(args, work):
    """One scene per failing case: campaign draws, then the reproducers."""
    sh("cargo", "build", "--release", "-p", "nanhunt", "-p", "nanhunt-bench-tools", "--bin", "nanhunt",
       "--bin", "campaign_cases")
    cases = work / "cases"
    sh(str(ROOT / "target/release/campaign_cases"), str(cases), str(args.runs), str(args.seed))
    sources = [("campaign", p) for p in sorted(cases.glob("*.json"))]
    sources += [("repro", p) for p in sorted((ROOT / "corpora/repro").glob("*.json"))]
    scenes = []
    for origin, path in sources:
        out = work / "scenes" / f"{origin}-{path.stem}"
        scene = dump(path, out)
        if scene:
            scenes.append((origin, path, out, *scene))
    return scenes


def precision_name(case):
    p = case["precision"]
    return "mixed" if p["kind"] == "mixed" else p["kind"]


def judge(origin, path, out, scene, tensors):
    case = json.loads((out / "case.json").read_text())
    f = scene["finding"]
    mark = ((f.get("precision") or {}).get("framework")) or {"verdict": "not_judged", "note": "no mark"}
    row = {
        "finding": f"{origin}/{path.stem}",
        "family": case["model"]["family"],
        "precision": precision_name(case),
        "loss": case["loss"]["kind"],
        "optimizer": case["optimizer"]["kind"],
        "kind": f["kind"],
        "phase": f["phase"],
        "stage": f["stage"],
        "mark": mark["verdict"],
        "rule": mark.get("rule", ""),
    }
    try:
        ran = pytorch_step.step(case, scene, tensors)
    except NotImplementedError as e:
        row.update(pytorch="not run", pytorch_at="", agrees="", port_check=f"not run: {e}", notes="")
        return row
    failure = ran["failure"]
    row["notes"] = "; ".join(ran["notes"])
    row["pytorch"] = "fails" if failure else "healthy"
    row["pytorch_at"] = described(failure) if failure else ""
    # The port's check: nanhunt's loss of this step, where it saw one.
    ours = scene.get("recent_losses") or []
    loss_seen = f["phase"] not in ("data", "augment", "forward", "loss") or f["kind"] == "divergence"
    if loss_seen and ours and ran["loss"] is not None:
        a, b = ours[-1], ran["loss"]
        # Only f32 and f64 must agree: in a half dtype the two frameworks'
        # numerics differ by design (what the mark is about).
        tol = TOLERANCE.get(row["precision"])
        verdict = "half" if tol is None else "ok" if close(a, b, tol) else "MISMATCH"
        row["port_check"] = f"{verdict}: nanhunt {a:.6g}, PyTorch {b:.6g}"
    else:
        row["port_check"] = "no finite loss to compare"
    verdict = mark["verdict"]
    if verdict == "fails_too":
        row["agrees"] = "yes" if failure else "no"
    elif verdict == "candle_specific":
        row["agrees"] = "no" if failure else "yes"
    else:
        row["agrees"] = ""
    return row


def port_check(args, work):
    """The port checked end to end in f64, where both frameworks compute
    exactly the same formulas: every campaign case turned f64 is dumped at
    steps 0 and 1; PyTorch runs step 0 from the first scene, and its loss
    there and its loss at step 1 (its own updated parameters on step 1's
    batch) must be nanhunt's. A forward, loss, backward or optimizer that
    computed something else would move one of the two."""
    rows = []
    for path in sorted((work / "cases").glob("*.json")):
        case = json.loads(path.read_text())
        case["precision"] = {"kind": "f64"}
        case["steps"] = max(case["steps"], 2)
        d = work / "port" / path.stem
        d.mkdir(parents=True, exist_ok=True)
        (d / "case.json").write_text(json.dumps(case))
        scenes = [dump(d / "case.json", d / f"step{at}", at) for at in (0, 1)]
        # Only steps nanhunt ran healthy: a failing one is the table's business.
        if None in scenes or any(s.get("finding") for s, _ in scenes):
            continue
        (s0, t0), (s1, t1) = scenes
        first = pytorch_step.step(case, s0, t0)
        if first["failure"]:
            notes = "".join(f"; {n}" for n in first["notes"])
            rows.append((case["model"]["family"], path.stem, False,
                         f"PyTorch's step 0 fails: {described(first['failure'])}{notes}"))
            continue
        moved = dict(t1, **{"param/" + n: v for n, v in first["params"].items()})
        second = pytorch_step.step(case, s1, moved)
        ours = (s0["recent_losses"][-1], s1["recent_losses"][-1])
        theirs = (first["loss"], second["loss"])
        ok = theirs[1] is not None and close(ours[0], theirs[0], 1e-9) and close(ours[1], theirs[1], 1e-6)
        rows.append((case["model"]["family"], path.stem, ok,
                     f"nanhunt {ours[0]:.12g} then {ours[1]:.12g}; PyTorch {theirs[0]:.12g} then {theirs[1]}"))
    return rows


FIELDS = ["finding", "family", "precision", "loss", "optimizer", "kind", "phase", "stage", "mark", "rule",
          "pytorch", "pytorch_at", "agrees", "port_check", "notes"]


def write(rows, args, port):
    csv_path = ROOT / "docs/pytorch-findings.csv"
    tmp = csv_path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, csv_path)
    judged = [r for r in rows if r["agrees"]]
    agree = sum(r["agrees"] == "yes" for r in judged)
    not_judged = [r for r in rows if r["mark"] == "not_judged"]
    mismatched = [r for r in rows if r["port_check"].startswith("MISMATCH")]
    checked = [r for r in rows if r["port_check"].startswith(("ok", "MISMATCH"))]
    md = [
        "# The framework mark against PyTorch, finding by finding",
        "",
        f"Every finding of a fresh {args.runs}-run campaign (seed {args.seed}, generated cases, no mutations)",
        "and of every reproducer in `corpora/repro`, its failing step re-run in PyTorch "
        f"{torch.__version__} ({torch.backends.cpu.get_cpu_capability()} kernels, one thread, {datetime.date.today()})",
        "from the scene nanhunt dumped (the same parameters, optimizer state and batch),",
        "as `scripts/pytorch_step.py` writes a PyTorch user's step. Made by",
        f"`python scripts/pytorch-findings.py --runs {args.runs} --seed {args.seed}` (a Python with torch; not CI);",
        "the rows are in `docs/pytorch-findings.csv`.",
        "",
        "*PyTorch fails*: its step shows a NaN or an infinity in the batch, a forward stage (an additive mask",
        "of -inf excepted), the loss, a gradient (under dynamic loss scaling: a NaN still there at the",
        "floor scale; an overflow is a step GradScaler skips) or the updated parameters and optimizer state;",
        "raises on the batch (a label out of range); or, for a divergence, its loss crosses the",
        "scene's divergence line. *Agrees*: `PyTorch would fail too` where PyTorch fails, `candle-specific`",
        "where its step is healthy; a `not judged` mark makes no claim. *The port's check*: in f32 and f64",
        "the loss PyTorch computes must be nanhunt's (relative 1e-4, 1e-9), or the port computes another",
        "model; in a half dtype the two differ by design.",
        "",
        f"- findings: {len(rows)}; judged by the mark: {len(judged)}; not judged: {len(not_judged)}",
        f"- **judged marks that agree with PyTorch: {agree} of {len(judged)}**",
        f"- the port's check: PyTorch's loss of the step matches nanhunt's in {len(checked) - len(mismatched)} "
        f"of {len(checked)} f32/f64 findings whose loss nanhunt saw finite",
        f"- the port's check end to end: of the campaign's {args.runs} cases turned f64, {len(port)} ran steps 0 and 1 "
        f"healthy; in {sum(ok for *_, ok, _ in port)} of them PyTorch's loss at step 0 matches nanhunt's (relative "
        "1e-9) and so does its loss at step 1 after its own update (relative 1e-6): by family "
        + ", ".join(f"{fam} {sum(ok for f, _, ok, _ in port if f == fam)}/{sum(f == fam for f, *_ in port)}"
                    for fam in ("cnn", "transformer", "rnn", "decoder", "encoder")),
        "",
        "| mark | PyTorch fails | PyTorch healthy | PyTorch not run |",
        "|---|---|---|---|",
    ]
    for verdict in ("fails_too", "candle_specific", "not_judged"):
        these = [r for r in rows if r["mark"] == verdict]
        count = [sum(r["pytorch"] == o for r in these) for o in ("fails", "healthy", "not run")]
        md.append(f"| {verdict} | {count[0]} | {count[1]} | {count[2]} |")
    md += [
        "",
        "By family: " + ", ".join(f"{k} {v}" for k, v in Counter(r["family"] for r in rows).most_common()) + "; by precision: "
        + ", ".join(f"{k} {v}" for k, v in Counter(r["precision"] for r in rows).most_common()) + ".",
        "",
        "| finding | family | precision | kind | phase | stage | mark | PyTorch | agrees |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = r["mark"] + (f" ({r['rule']})" if r["rule"] else "")
        seen = r["pytorch"] + (f": {r['pytorch_at']}" if r["pytorch_at"] else "")
        md.append(f"| `{r['finding']}` | {r['family']} | {r['precision']} | {r['kind']} | {r['phase']} | "
                  f"`{r['stage']}` | {mark} | {seen} | {r['agrees'] or '—'} |")
    bad = [p for p in port if not p[2]]
    if bad:
        md += ["", "Cases whose f64 steps PyTorch computed otherwise:", ""]
        md += [f"- `{name}` ({fam}): {what}" for fam, name, _, what in bad]
    out = ROOT / "docs/PYTORCH-FINDINGS.md"
    tmp = out.with_suffix(".md.tmp")
    tmp.write_text("\n".join(md) + "\n")
    os.replace(tmp, out)
    print(f"{agree} of {len(judged)} judged marks agree; {len(not_judged)} not judged; "
          f"port check {len(checked) - len(mismatched)}/{len(checked)}, "
          f"end to end in f64 {len(port) - len(bad)}/{len(port)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="target/pytorch-findings", help="cases and scenes (kept between runs)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = ROOT / args.work
    rows = [judge(*s) for s in dump_scenes(args, work)]
    write(rows, args, port_check(args, work))


if __name__ == "__main__":
    main()
