"""One training step of a nanhunt scene, run in PyTorch.

A scene (`nanhunt run CASE --dump DIR`) holds the parameters and optimizer
state from before the failing step, that step's batch, and the case. This
module rebuilds the case's model in PyTorch from those parameters (by
nanhunt's names), runs the step as a PyTorch user would write it, and says
whether and where it fails:

- the model's layers are PyTorch's own (F.linear, F.conv2d, F.batch_norm,
  F.layer_norm, F.gelu, F.embedding, torch.softmax, ...); attention is the
  model's plain softmax (not scaled_dot_product_attention), RMSNorm the
  Llama form (statistics in f32 for a half input), recurrent cells the
  PyTorch equations written out per time step;
- pure f16/bf16: parameters, batch (`.half()`) and optimizer state in that
  dtype, torch.optim updating them in it; mixed: f32 parameters, the
  forward under torch.autocast, the loss in f32, the case's loss scaling
  (GradScaler's rule: a step whose gradients overflow is skipped);
- losses with a fused PyTorch counterpart use it (cross_entropy, nll,
  mse, huber, bce_with_logits, poisson_nll); those nanhunt defines by a
  formula (naive_cross_entropy, bce, kl_div, log_one_minus) are that
  formula in PyTorch ops (nn.BCELoss would clamp its logs at -100);
- the update is torch.optim's (SGD, Adam, AdamW, RMSprop) at the
  schedule's rate, after clip_grad_norm_ / clip_grad_value_.
"""
import math

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}


class Failed(Exception):
    """The step failed: its phase, the stage, and what was seen."""

    def __init__(self, phase, stage, what):
        super().__init__(f"{what} in {phase} at `{stage}`")
        self.phase, self.stage, self.what = phase, stage, what


def non_finite(t):
    """'nan', 'inf' or None for a tensor."""
    if not torch.is_floating_point(t):
        return None
    if torch.isnan(t).any():
        return "nan"
    if torch.isinf(t).any():
        return "inf"
    return None


class Recorder:
    """Forward stages by nanhunt's names; the first non-finite one fails the
    step. `notes`: where the port had to depart from PyTorch's layer."""

    def __init__(self):
        self.notes = []

    def __call__(self, name, t):
        bad = non_finite(t.detach())
        # An additive mask of -inf is a mask (what f32::MIN rounds to in a
        # half dtype, what masked_fill(-inf) writes): only NaN fails there.
        if bad == "inf" and name.endswith(".attn.mask") and not torch.isposinf(t).any():
            return t
        if bad:
            raise Failed("forward", name, bad)
        return t


# ---------------------------------------------------------------- models


def linear(p, name, x):
    return F.linear(x, p[name + ".weight"], p[name + ".bias"])


def activate(x, kind):
    return {
        "relu": F.relu,
        "gelu": F.gelu,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "leaky_relu": lambda v: F.leaky_relu(v, 0.01),
    }[kind](x)


def cnn(spec, p, x, rec):
    for i, b in enumerate(spec["blocks"]):
        n = f"block{i}"
        skip = x
        w = p[n + ".conv.weight"]
        y = rec(n + ".conv", F.conv2d(x, w, p[n + ".conv.bias"], padding=w.shape[-1] // 2))
        if b.get("batch_norm_eps") is not None:
            y = rec(n + ".bn", batch_norm(y, p[n + ".bn.weight"], p[n + ".bn.bias"], b["batch_norm_eps"], rec))
        y = rec(n + ".act", activate(y, b["activation"]))
        if b.get("residual"):
            y = rec(n + ".residual", y + skip)
        pool = b.get("pool", "none")
        if pool == "max":
            y = rec(n + ".pool", F.max_pool2d(y, 2))
        elif pool == "avg":
            y = rec(n + ".pool", F.avg_pool2d(y, 2))
        x = y
    pooled = rec("head.pool", x.mean((2, 3)))
    return rec("head.linear", linear(p, "head", pooled))


def batch_norm(y, w, b, eps, rec):
    """F.batch_norm in training mode; where PyTorch refuses the case (eps
    0, one value per channel) the user's only way is the formula written
    out, and the row says so."""
    try:
        return F.batch_norm(y, None, None, w, b, training=True, eps=eps)
    except ValueError as e:
        note = f"F.batch_norm refuses ({str(e).split(',')[0]}): BN's formula written out"
        if note not in rec.notes:
            rec.notes.append(note)
    mean = y.mean((0, 2, 3), keepdim=True)
    centered = y - mean
    var = centered.pow(2).mean((0, 2, 3), keepdim=True)
    return centered / torch.sqrt(var + eps) * w.reshape(1, -1, 1, 1) + b.reshape(1, -1, 1, 1)


def split_heads(t, heads):
    b, s, d = t.shape
    return t.reshape(b, s, heads, d // heads).transpose(1, 2)


def merge_heads(t):
    b, h, s, hd = t.shape
    return t.transpose(1, 2).reshape(b, s, h * hd)


def scale_of(spec, head_dim):
    return 1.0 / math.sqrt(head_dim) if spec.get("attention_scale", "inv_sqrt_d") == "inv_sqrt_d" else None


def causal(scores, _layer=None):
    s = scores.shape[-1]
    keep = torch.ones(s, s, dtype=torch.bool).tril()
    return scores.masked_fill(~keep, float("-inf"))


def attention(p, n, x, heads, scale, rec, mask=None, kv=None, rope=None):
    """Self-attention with the model's plain softmax; `mask(scores)` masks keys."""
    q = rec(n + ".attn.q", linear(p, n + ".attn.q", x))
    k = rec(n + ".attn.k", linear(p, n + ".attn.k", x))
    v = rec(n + ".attn.v", linear(p, n + ".attn.v", x))
    kv_heads = kv or heads
    q, k, v = split_heads(q, heads), split_heads(k, kv_heads), split_heads(v, kv_heads)
    if rope is not None:
        q, k = rope(q), rope(k)
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2)
    if scale is not None:
        scores = scores * scale
    scores = rec(n + ".attn.scores", scores)
    if mask is not None:
        scores = mask(scores, n)
    probs = rec(n + ".attn.softmax", torch.softmax(scores, dim=-1))
    return rec(n + ".attn.out", linear(p, n + ".attn.o", merge_heads(probs @ v)))


def transformer(spec, p, x, rec):
    d, heads = spec["d_model"], spec["heads"]
    if spec["input"]["kind"] == "tokens":
        h = F.embedding(x, p["embed.weight"])
    else:
        h = linear(p, "embed", x)
    h = rec("embed", h + p["pos.weight"])
    norm = spec.get("norm", "pre")
    eps = spec.get("norm_eps", 1e-5)
    scale = scale_of(spec, d // heads)
    mask = causal if spec.get("causal") else None

    def ln(name, v):
        if norm == "none":
            return v
        return rec(name, F.layer_norm(v, (d,), p[name + ".weight"], p[name + ".bias"], eps))

    def mlp(n, v):
        a = rec(n + ".mlp.fc1", F.gelu(linear(p, n + ".mlp.fc1", v)))
        return rec(n + ".mlp.fc2", linear(p, n + ".mlp.fc2", a))

    for i in range(spec["layers"]):
        n = f"layer{i}"
        if norm == "pre":
            h = h + attention(p, n, ln(n + ".ln1", h), heads, scale, rec, mask)
            h = h + mlp(n, ln(n + ".ln2", h))
        else:
            h = ln(n + ".ln1", h + attention(p, n, h, heads, scale, rec, mask))
            h = ln(n + ".ln2", h + mlp(n, h))
    if norm == "pre":
        h = ln("final_ln", h)
    if spec.get("head", "classify") == "classify":
        h = rec("head.pool", h.mean(1))
    return rec("head.linear", linear(p, "head", h))


def rms_norm(v, w, eps):
    """Llama's RMSNorm: statistics in f32 for a half input, the weight after the cast back."""
    if v.dtype in (torch.float16, torch.bfloat16):
        f = v.float()
        return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(v.dtype) * w
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w


def decoder(spec, p, ids, rec):
    d, heads, kv = spec["d_model"], spec["heads"], spec["kv_heads"]
    hd, eps = d // heads, spec.get("rms_eps", 1e-5)
    theta = spec.get("rope_theta", 10000.0)
    s = ids.shape[1]
    h = rec("embed", F.embedding(ids, p["embed.weight"]))
    angles = torch.tensor([[t * theta ** (-2.0 * i / hd) for i in range(hd // 2)] for t in range(s)],
                          dtype=torch.float64)
    cos, sin = angles.cos().to(h.dtype), angles.sin().to(h.dtype)

    def rope(t):  # (B, H, S, hd), rotate-half
        half = t.shape[-1] // 2
        t1, t2 = t[..., :half], t[..., half:]
        c, sn = cos.to(t.dtype), sin.to(t.dtype)
        return torch.cat([t1 * c - t2 * sn, t1 * sn + t2 * c], dim=-1)

    scale = scale_of(spec, hd)
    for i in range(spec["layers"]):
        n = f"layer{i}"
        a = rec(n + ".ln1", rms_norm(h, p[n + ".ln1.weight"], eps))
        h = h + attention(p, n, a, heads, scale, rec, causal, kv, rope)
        a = rec(n + ".ln2", rms_norm(h, p[n + ".ln2.weight"], eps))
        g = rec(n + ".mlp.swiglu", F.silu(linear(p, n + ".mlp.gate", a)) * linear(p, n + ".mlp.up", a))
        h = h + rec(n + ".mlp.down", linear(p, n + ".mlp.down", g))
    h = rec("final_norm", rms_norm(h, p["final_norm.weight"], eps))
    return rec("head.linear", linear(p, "head", h))


def encoder(spec, p, ids, rec):
    d, heads = spec["d_model"], spec["heads"]
    eps = spec.get("norm_eps", 1e-12)

    def ln(name, v, params=None):
        params = params or name
        return rec(name, F.layer_norm(v, (d,), p[params + ".weight"], p[params + ".bias"], eps))

    h = ln("embed", F.embedding(ids, p["embed.weight"]) + p["pos.weight"], "embed_ln")
    mask_spec = spec.get("mask", {"kind": "additive", "value": -1e4})
    padded = (ids == 0)[:, None, None, :]
    if mask_spec["kind"] == "additive":
        # BERT's extended mask: (1 - keep) * value, in the activations' dtype.
        keep = (ids != 0).to(h.dtype)[:, None, None, :]
        add = (1.0 - keep) * mask_spec["value"]

        def mask(scores, n):
            return scores + rec(n + ".attn.mask", add)
    else:
        def mask(scores, _n):
            return scores.masked_fill(padded, float("-inf"))
    scale = scale_of(spec, d // heads)
    for i in range(spec["layers"]):
        n = f"layer{i}"
        h = ln(n + ".ln1", h + attention(p, n, h, heads, scale, rec, mask))
        a = rec(n + ".mlp.fc1", F.gelu(linear(p, n + ".mlp.fc1", h)))
        h = ln(n + ".ln2", h + rec(n + ".mlp.fc2", linear(p, n + ".mlp.fc2", a)))
    return rec("head.linear", linear(p, "head", rec("head.first", h[:, 0])))


def rnn(spec, p, x, rec):
    hd, cell = spec["hidden"], spec["cell"]
    steps = x.shape[1]
    for i in range(spec.get("layers", 1)):
        n = f"layer{i}"
        xw = linear(p, n + ".input", x)
        h = torch.zeros(x.shape[0], hd, dtype=xw.dtype)
        c = h
        outs = []
        for t in range(steps):
            xt, hw = xw[:, t], linear(p, n + ".hidden", h)
            if cell == "rnn":
                h = torch.tanh(rec(f"{n}.t{t}.gates", xt + hw))
            elif cell == "lstm":
                g = rec(f"{n}.t{t}.gates", xt + hw)
                i_g, f_g, g_g, o_g = g.chunk(4, dim=1)
                c = rec(f"{n}.t{t}.c", torch.sigmoid(f_g) * c + torch.sigmoid(i_g) * torch.tanh(g_g))
                h = torch.sigmoid(o_g) * torch.tanh(c)
            else:  # gru, PyTorch's: n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
                rz = rec(f"{n}.t{t}.gates", xt[:, :2 * hd] + hw[:, :2 * hd])
                r, z = torch.sigmoid(rz[:, :hd]), torch.sigmoid(rz[:, hd:])
                cand = torch.tanh(xt[:, 2 * hd:] + r * hw[:, 2 * hd:])
                h = (1 - z) * cand + z * h
            h = rec(f"{n}.t{t}.h", h)
            outs.append(h)
        x = torch.stack(outs, 1)
    return rec("head.linear", linear(p, "head", x[:, -1]))


MODELS = {"cnn": cnn, "transformer": transformer, "decoder": decoder, "encoder": encoder, "rnn": rnn}


# ---------------------------------------------------------------- losses

# The losses whose targets are class labels (nanhunt's TargetKind::Labels).
LABEL_LOSSES = ("cross_entropy", "naive_cross_entropy", "nll")


def selected(t, x):
    """t * x where t > 0, else 0 (nanhunt's gather of the target entries)."""
    return torch.where(t > 0, t * x, torch.zeros_like(x))


def loss_of(spec, z, t):
    kind = spec["kind"]
    eps = spec.get("eps", 0.0)
    if kind in ("cross_entropy", "nll"):
        return F.cross_entropy(z, t, label_smoothing=spec.get("label_smoothing", 0.0))
    if kind == "naive_cross_entropy":
        return -selected(t, torch.log(torch.softmax(z, -1) + eps)).sum(-1).mean()
    if kind == "mse":
        m = F.mse_loss(z, t)
        return torch.sqrt(m + eps) if spec.get("root") else m
    if kind == "huber":
        return F.huber_loss(z, t, delta=spec.get("delta", 1.0))
    if kind == "bce":
        q = torch.sigmoid(z).clamp(eps, 1 - eps)
        return -(t * torch.log(q) + (1 - t) * torch.log(1 - q)).mean()
    if kind == "bce_with_logits":
        return F.binary_cross_entropy_with_logits(z, t)
    if kind == "kl_div":
        q = torch.softmax(z, -1).clamp(eps, 1 - eps)
        return (selected(t, torch.log(t)) - t * torch.log(q)).sum(-1).mean()
    if kind == "poisson_nll":
        return F.poisson_nll_loss(z, t, log_input=spec.get("log_input", True), full=False, eps=eps)
    if kind == "log_one_minus":
        q = torch.sigmoid(z).clamp(eps, 1 - eps)
        return (torch.log(1 - q) * t).mean()
    raise NotImplementedError(f"loss {kind}")


# ---------------------------------------------------------------- update


def lr_at(schedule, base, step, total):
    kind = schedule.get("kind", "constant")

    def warm(w):
        return (step + 1) / w if w > 0 and step < w else 1.0
    if kind == "constant":
        return base
    if kind == "warmup":
        return base * warm(schedule["warmup_steps"])
    if kind == "cosine":
        w = schedule.get("warmup_steps", 0)
        if step < w:
            return base * warm(w)
        span = max(max(total - w - 1, 0), 1)
        progress = min((step - w) / span, 1.0)
        mf = schedule.get("min_factor", 0.0)
        return base * (mf + (1 - mf) * 0.5 * (1 + math.cos(math.pi * progress)))
    if kind == "step":
        return base * schedule["gamma"] ** (step // schedule["step_size"])
    raise NotImplementedError(f"schedule {kind}")


def optimizer(spec, params, lr):
    kind = spec["kind"]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=spec.get("momentum", 0.0),
                               nesterov=spec.get("nesterov", False), weight_decay=spec.get("weight_decay", 0.0))
    betas = (spec.get("beta1", 0.9), spec.get("beta2", 0.999))
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=spec.get("eps", 1e-8),
                                weight_decay=spec.get("weight_decay", 0.0), foreach=False)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=spec.get("eps", 1e-8),
                                 weight_decay=spec.get("weight_decay", 0.01), foreach=False)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=spec.get("alpha", 0.99), eps=spec.get("eps", 1e-8),
                                   momentum=spec.get("momentum", 0.0), weight_decay=spec.get("weight_decay", 0.0),
                                   foreach=False)
    raise NotImplementedError(f"optimizer {kind}")


def load_state(opt, kind, names, params, tensors, steps):
    """The scene's moments as torch.optim's state (after `steps` updates)."""
    if steps == 0:
        return
    keys = {"sgd": {"momentum_buffer": "momentum"},
            "adam": {"exp_avg": "m", "exp_avg_sq": "v"},
            "adamw": {"exp_avg": "m", "exp_avg_sq": "v"},
            "rmsprop": {"square_avg": "v", "momentum_buffer": "momentum"}}[kind]
    for name, p in zip(names, params):
        state = {}
        for torch_key, ours in keys.items():
            t = tensors.get(f"optimizer/{ours}.{name}")
            if t is not None:
                state[torch_key] = t.to(p.dtype).clone()
        if kind != "sgd":
            state["step"] = torch.tensor(float(steps))
        if state:
            opt.state[p] = state


# ---------------------------------------------------------------- divergence


SMOOTHING, FLOOR_FRACTION, CORRECTED_UNTIL = 0.98, 0.25, 1853


def crosses(tracker, loss):
    """Whether `loss` pushed on the scene's divergence tracker crosses its
    line (nanhunt's DivergenceTracker::push, the crossing a replay sees)."""
    factor, avg, steps = tracker["factor"], tracker["avg"], tracker["steps"]
    best, first = float(tracker["best"]), float(tracker["first"])
    if steps == 0:
        first = loss
    steps += 1
    avg = SMOOTHING * avg + (1 - SMOOTHING) * loss
    smoothed = avg if steps >= CORRECTED_UNTIL else avg / (1 - SMOOTHING ** steps)
    scale = max(abs(best), FLOOR_FRACTION * abs(first), 2.2250738585072014e-308)
    above = smoothed - best > (factor - 1) * scale
    return steps > 1 and tracker.get("best_at_crossing") is None and above


# ---------------------------------------------------------------- the step


def run_step(case, scene, tensors, seen):
    """The scene's step; returns (phase, stage, what) of its first failure,
    or None when it is healthy, and puts the loss, the recorder and the
    updated parameters in `seen` as far as the step got."""
    precision = case["precision"]
    mixed = precision["kind"] == "mixed"
    half = DTYPES[precision["compute"]] if mixed else None
    dtype = torch.float32 if mixed else DTYPES[precision["kind"]]
    names = scene["vars"]
    params = [tensors["param/" + n].to(dtype).clone().requires_grad_() for n in names]
    p = dict(zip(names, params))
    model = case["model"]
    family = model["family"]
    if family not in MODELS:
        raise NotImplementedError(f"family {family}")
    inputs = tensors["batch/inputs"]
    if torch.is_floating_point(inputs):
        inputs = inputs.to(dtype)  # the batch cast to the model's dtype (x.half())
        bad = non_finite(inputs)
        if bad:
            return ("data", "inputs", bad)
    else:
        inputs = inputs.long()
    classes = tensors["batch/targets"].shape[-1]
    labels = tensors["batch/labels"]
    takes_labels = case["loss"]["kind"] in LABEL_LOSSES
    if takes_labels and labels.numel() and (labels.min() < 0 or labels.max() >= classes):
        try:  # a PyTorch user's targets come from the labels
            F.one_hot(labels, classes)
        except RuntimeError as e:
            return ("data", "labels", f"error: {str(e).splitlines()[0]}")
    loss_dtype = torch.float32 if mixed else dtype
    targets = tensors["batch/targets"].to(loss_dtype)
    mix = None
    if "batch/mix_targets" in tensors:
        mix = (float(tensors["batch/mix_lambda"].reshape(-1)[0]), tensors["batch/mix_targets"].to(loss_dtype))
    rec = seen["recorder"] = Recorder()
    try:
        ctx = torch.autocast("cpu", dtype=half) if mixed else torch.autocast("cpu", enabled=False)
        with ctx:
            out = MODELS[family](model, p, inputs, rec)
        logits = (out.flatten(0, 1) if out.dim() == 3 else out).to(loss_dtype)
        loss = loss_of(case["loss"], logits, targets)
        if mix:
            loss = mix[0] * loss + (1 - mix[0]) * loss_of(case["loss"], logits, mix[1])
    except Failed as f:
        return (f.phase, f.stage, f.what)
    seen["loss"] = loss.detach().item()
    bad = non_finite(loss.detach())
    if bad:
        return ("loss", "loss", bad)
    if (scene.get("finding") or {}).get("kind") == "divergence":
        if crosses(scene["tracker"], seen["loss"]):
            return ("update", "loss_trend", "divergence")
        return None
    scaler = scene.get("scaler") or {}
    scale = float(scaler.get("scale", 1.0))
    grads = torch.autograd.grad(loss * scale if scale != 1.0 else loss, params, allow_unused=True,
                                retain_graph=True)
    grads = [torch.zeros_like(q) if g is None else g for g in grads]
    bad = next(((n, b) for n, g in zip(names, grads) if (b := non_finite(g))), None)
    if bad and scaler.get("dynamic"):
        # GradScaler skips a step whose gradients overflow; a NaN that is
        # there at the floor scale too is no overflow (nanhunt's rule).
        floor = min(float(scaler.get("floor", 1.0)), 1.0)
        at_floor = torch.autograd.grad(loss * floor, params, allow_unused=True)
        if any(g is not None and torch.isnan(g).any() for g in at_floor):
            return ("backward", "grad." + bad[0], "nan")
        return None
    if bad:
        return ("backward", "grad." + bad[0], bad[1])
    if scale != 1.0:
        grads = [g / scale for g in grads]
    for q, g in zip(params, grads):
        q.grad = g.detach().clone()
    clip = case.get("clip", {"kind": "none"})
    if clip["kind"] == "norm":
        torch.nn.utils.clip_grad_norm_(params, clip["max_norm"])
    elif clip["kind"] == "value":
        torch.nn.utils.clip_grad_value_(params, clip["value"])
    ospec = case["optimizer"]
    lr = lr_at(case.get("schedule", {"kind": "constant"}), ospec["lr"], scene["step"], case["steps"])
    opt = optimizer(ospec, params, lr)
    load_state(opt, ospec["kind"], names, params, tensors, scene["optimizer"].get("steps", 0))
    with torch.no_grad():
        opt.step()
    seen["params"] = {n: q.detach() for n, q in zip(names, params)}
    for n, q in zip(names, params):
        bad = non_finite(q.detach())
        if bad:
            zeros = int((q.grad == 0).sum())
            return ("update", "param." + n, f"{bad} ({zeros} of {q.numel()} gradient elements exactly 0.0)")
        for key, t in opt.state.get(q, {}).items():
            if torch.is_tensor(t) and t.dim() and (b := non_finite(t)):
                return ("update", f"optimizer.{key}.{n}", b)
    return None


def step(case, scene, tensors):
    """Runs the scene's step in PyTorch: {"failure": (phase, stage, what)
    or None for a healthy step, "loss": the step's loss or None}. An error
    PyTorch raises (a label out of range) is a failure of the data.
    "params": the parameters after the update, by name (None where the
    step did not reach it)."""
    seen = {"loss": None, "recorder": None, "params": None}
    failure = run_step(case, scene, tensors, seen)
    notes = seen["recorder"].notes if seen["recorder"] else []
    return {"failure": failure, "loss": seen["loss"], "notes": notes, "params": seen["params"]}
