#!/usr/bin/env python3
"""Runs, in PyTorch, the small cases behind each rule of the framework mark
(docs/NUMERICS.md) and records what PyTorch did.

    PYTHON_WITH_TORCH scripts/pytorch-rules.py [--out docs]

Needs torch (not CI: the tests read the table this writes). Writes
`docs/pytorch-rules.csv` (one row per case: id, rule, what was run, the
dtype, PyTorch's result, whether PyTorch shows what candle's finding rests
on — a non-finite value, or gradient elements exactly 0.0 — the version
and CPU capability that ran it) and
`docs/PYTORCH-RULES.md`, the same table for readers. Each case is the one a
test in tests/integration/fidelity.rs builds in candle; the test reads its
row and checks that the framework mark agrees with what PyTorch did.
"""
import argparse
import csv
import datetime
import math
import os

import torch
import torch.nn.functional as F

F16 = torch.float16


def finite(t):
    return bool(torch.isfinite(t).all())


def show(t):
    values = t.detach().float().flatten().tolist()
    return "[" + ", ".join(f"{v:.6g}" for v in values[:4]) + (", …" if len(values) > 4 else "") + "]"


def half_mean():
    x = torch.full((128,), 600.0, dtype=F16)
    m = x.mean()
    return "mean of 128 × 600 in f16", "f16", show(m), not finite(m)


def half_sum():
    x = torch.full((128,), 600.0, dtype=F16)
    s = x.sum()
    return "sum of 128 × 600 in f16 (76800 is past 65504)", "f16", show(s), not finite(s)


def sqrt_backward():
    x = torch.tensor([1e-4], dtype=F16, requires_grad=True)
    x.sqrt().backward(torch.tensor([1000.0], dtype=F16))
    return "d/dx √x at 1e-4 times an upstream 1000, in f16", "f16", show(x.grad), not finite(x.grad)


def half_affine_mask():
    keep = torch.tensor([1.0, 0.0], dtype=F16)
    m = (1 - keep) * torch.finfo(torch.float32).min
    # The kept position's value is what candle makes NaN (0 · −inf).
    return "(1 − keep) · f32::MIN with keep = [1, 0] in f16, the kept position", "f16", show(m), not finite(m[0])


def masked_row_softmax():
    s = torch.softmax(torch.full((1, 3), -math.inf), dim=-1)
    return "softmax of a row of −inf (torch.softmax)", "f32", show(s), not finite(s)


def masked_row_sdpa():
    q = torch.randn(1, 1, 2, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[False, False], [True, True]]).view(1, 1, 2, 2)
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    return "scaled_dot_product_attention, query 0 masked at every key", "f32", show(out[0, 0, 0]), not finite(out[0, 0, 0])


def adam_f16():
    p = torch.nn.Parameter(torch.zeros(4, dtype=F16))
    opt = torch.optim.Adam([p], lr=1e-3, eps=1e-8)
    p.grad = torch.zeros(4, dtype=F16)
    opt.step()
    return "torch.optim.Adam (eps 1e-8) on f16 parameters, a zero gradient", "f16", show(p), not finite(p)


def batch_cast():
    x = torch.tensor([7e4]).half()
    return "a batch value of 7e4 cast with .half()", "f16", show(x), not finite(x)


def layer_norm_f16():
    x = torch.tensor([[300.0, -300.0, 290.0, -310.0]], dtype=F16)
    y = F.layer_norm(x, (4,))
    return "F.layer_norm of values ±300 in f16", "f16", show(y), not finite(y)


def hand_variance_f16():
    x = torch.tensor([[300.0, -300.0, 290.0, -310.0]], dtype=F16)
    v = ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1)
    return "((x − mean)²).mean() of values ±300 in f16", "f16", show(v), not finite(v)


def two_scalings_f16():
    x = torch.tensor([3.0], dtype=F16)
    y = (x * 1000.0) * 100.0 / 1e5
    return "(x · 1000) · 100 / 1e5 at x = 3 in f16", "f16", show(y), not finite(y)


def dead_unit_gradient():
    torch.manual_seed(0)
    w = torch.full((16, 8), -0.5, requires_grad=True)
    x = torch.rand(32, 8) + 5.0
    h = torch.relu(x @ w.t())
    (h.sum()).backward()
    zeros = int((w.grad == 0).sum())
    return f"gradient of weights behind ReLU units dead for the batch: {zeros} of {w.grad.numel()} exactly 0.0", "f32", show(w.grad), zeros == w.grad.numel()


def relu_grad_at_zero():
    x = torch.zeros(1, requires_grad=True)
    torch.relu(x).backward()
    return "d/dx relu(x) at exactly 0", "f32", show(x.grad), False


def leaky_relu_grad_at_zero():
    x = torch.zeros(1, requires_grad=True)
    F.leaky_relu(x, 0.01).backward()
    return "d/dx leaky_relu(x, 0.01) at exactly 0", "f32", show(x.grad), False


def max_pool_nan():
    x = torch.tensor([[[[1.0, math.nan], [2.0, 3.0]]]])
    y = F.max_pool2d(x, 2)
    return "2×2 max pooling of [1, NaN, 2, 3]", "f32", show(y), not finite(y)


CASES = [
    ("half_mean", "half-precision accumulation", half_mean),
    ("half_sum", "half-precision accumulation", half_sum),
    ("sqrt_backward", "the square-root backward's order", sqrt_backward),
    ("half_affine_mask", "affine's multiplier rounded to the half dtype", half_affine_mask),
    ("masked_row_softmax", "a fully masked row", masked_row_softmax),
    ("masked_row_sdpa", "a fully masked row", masked_row_sdpa),
    ("adam_f16", "the update in the parameters' dtype", adam_f16),
    ("batch_cast", "the batch cast to the model's dtype", batch_cast),
    ("layer_norm_f16", "half-precision norm statistics", layer_norm_f16),
    ("hand_variance_f16", "half-precision norm statistics", hand_variance_f16),
    ("two_scalings_f16", "a half-precision intermediate", two_scalings_f16),
    ("dead_unit_gradient", "exact zeros", dead_unit_gradient),
    ("relu_grad_at_zero", "ReLU's gradient at 0", relu_grad_at_zero),
    ("leaky_relu_grad_at_zero", "leaky ReLU's gradient at 0", leaky_relu_grad_at_zero),
    ("max_pool_nan", "max pooling propagates NaN", max_pool_nan),
]

COLUMNS = ["id", "rule", "what", "dtype", "pytorch", "fails_too", "torch", "cpu"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs"))
    args = parser.parse_args()
    version, cpu = torch.__version__, torch.backends.cpu.get_cpu_capability()
    rows = []
    for case_id, rule, run in CASES:
        what, dtype, result, non_finite = run()
        rows.append([case_id, rule, what, dtype, result, str(non_finite).lower(), version, cpu])
    write_atomic(os.path.join(args.out, "pytorch-rules.csv"), lambda f: write_csv(f, rows))
    write_atomic(os.path.join(args.out, "PYTORCH-RULES.md"), lambda f: write_md(f, rows, version, cpu))
    for r in rows:
        print(f"{r[0]:24} {r[4]:40} fails too: {r[5]}")


def write_csv(f, rows):
    w = csv.writer(f, lineterminator="\n")
    w.writerow(COLUMNS)
    w.writerows(rows)


def write_md(f, rows, version, cpu):
    today = datetime.date.today().isoformat()
    f.write("# What PyTorch does in each rule's case\n\n")
    f.write(
        "The small cases behind the framework mark's rules (docs/NUMERICS.md), "
        f"run in PyTorch {version} on a CPU with {cpu} on {today} by "
        "`scripts/pytorch-rules.py` (a Python with torch; not CI). The tests in "
        "`tests/integration/fidelity.rs` read `docs/pytorch-rules.csv` and check "
        "each mark against the row of its case. *Fails too*: PyTorch shows what "
        "candle's finding rests on (a non-finite value; for exact zeros, every "
        "element exactly 0.0).\n\n"
    )
    f.write("| case | rule | what | dtype | PyTorch gives | fails too |\n|---|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| `{r[0]}` | {r[1]} | {r[2]} | {r[3]} | `{r[4]}` | {r[5]} |\n")


def write_atomic(path, write):
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        write(f)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
