#!/usr/bin/env python3
"""The PyTorch side of the side-by-side benchmark (bench/side_by_side.sh).

The same five models as nanhunt's `--size large` cases, f32, batch 32,
Adam, cross-entropy, at one thread:
  cnn          3x32x32, two conv3x3(same)+relu+maxpool2 blocks (16, 32 channels),
               global average pooling, linear head (4 classes)
  transformer  tokens (vocab 64), seq 32, d 64, 4 heads, 2 pre-norm layers,
               GELU MLP x2, learned positions, final LayerNorm, mean pool, head
  rnn          LSTM, seq 32, input 16, hidden 64, head on the last hidden state
  decoder      Llama-style: tokens (vocab 64), seq 32, d 64, 4 query heads over
               2 key/value heads, 2 pre-norm layers of RMSNorm, rotary positions
               (rotate-half), causal attention, SwiGLU x2, final RMSNorm, a
               head over the vocabulary at every position (next-token loss)
  encoder      BERT-style: tokens (vocab 64) padded at the end (lengths 2..32),
               seq 32, d 64, 4 heads, 2 post-norm layers (eps 1e-12), GELU MLP
               x2, learned positions, embedding LayerNorm, key padding mask, a
               head on the first token
plus the fuzz workload (fresh 5-step CNN runs) and the cost of
torch.autograd.detect_anomaly per step. Prints one JSON object per line.

  pytorch_bench.py [STEPS] [FAMILY|fuzz] [nocompile]
  pytorch_bench.py serve FAMILY eager|compiled

The serve form keeps one model (compiled or not) and times steps on
request, for bench/paired.py: each line read is a step count, each line
written the seconds of those steps ({"times": [...]}), after
{"ready": true} (or {"error": ...} where torch.compile cannot compile).
"""
import json
import statistics
import sys
import time

import torch
from torch import nn

torch.set_num_threads(1)
BATCH, CLASSES = 32, 4


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


class Transformer(nn.Module):
    def __init__(self, vocab=64, seq=32, d=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.final_ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, CLASSES)

    def forward(self, ids):
        x = self.embed(ids) + self.pos
        return self.head(self.final_ln(self.encoder(x)).mean(1))


class Rnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 64, batch_first=True)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class RmsNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    """x (B, H, S, hd); rotate-half pairs, as nanhunt's decoder."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class DecoderBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.ln1, self.ln2 = RmsNorm(d), RmsNorm(d)
        self.q, self.o = nn.Linear(d, d), nn.Linear(d, d)
        self.k, self.v = nn.Linear(d, kv_heads * self.hd), nn.Linear(d, kv_heads * self.hd)
        self.gate, self.up, self.down = nn.Linear(d, hidden), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        h = self.ln1(x)
        q = self.q(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.ln2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, vocab=64, seq=32, d=64, heads=4, kv_heads=2, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(DecoderBlock(d, heads, kv_heads, 2 * d) for _ in range(layers))
        self.norm, self.head = RmsNorm(d), nn.Linear(d, vocab)
        hd = d // heads
        angles = torch.arange(seq)[:, None] * 10000.0 ** (-2 * torch.arange(hd // 2) / hd)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def forward(self, ids):
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        return self.head(self.norm(x)).flatten(0, 1)


class Encoder(nn.Module):
    def __init__(self, vocab=64, seq=32, d=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.embed_ln = nn.LayerNorm(d, eps=1e-12)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=False,
                                           layer_norm_eps=1e-12)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, CLASSES)

    def forward(self, ids):
        x = self.embed_ln(self.embed(ids) + self.pos)
        return self.head(self.encoder(x, src_key_padding_mask=ids == 0)[:, 0])


def padded_ids(seq=32, vocab=64):
    ids = torch.randint(1, vocab, (BATCH, seq))
    lengths = torch.randint(2, seq + 1, (BATCH, 1))
    return ids.masked_fill(torch.arange(seq)[None, :] >= lengths, 0)


def make(family, seed):
    torch.manual_seed(seed)
    if family == "cnn":
        return Cnn(), torch.randn(BATCH, 3, 32, 32)
    if family == "transformer":
        return Transformer(), torch.randint(0, 64, (BATCH, 32))
    if family == "decoder":
        return Decoder(), torch.randint(0, 64, (BATCH, 32))
    if family == "encoder":
        return Encoder(), padded_ids()
    return Rnn(), torch.randn(BATCH, 32, 16)


def train_steps(model, x, y, steps, anomaly=False, opt=None):
    """Seconds of each of `steps` training steps; a fresh Adam unless `opt`."""
    opt = opt or torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with torch.autograd.set_detect_anomaly(anomaly):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    return times


def compiled_ms(family, x, t, steps):
    """The same model under torch.compile (inductor, this CPU), ms per step
    after its compilation; or None and why it cannot compile here."""
    try:
        model, _ = make(family, 0)
        compiled = torch.compile(model)
        train_steps(compiled, x, t, 3)  # compiles, then warms up
        return statistics.median(train_steps(compiled, x, t, steps)) * 1e3, None
    except Exception as e:  # no C++ compiler, an op inductor cannot lower, ...
        return None, compile_error(e)


def compile_error(e):
    """Why torch.compile failed, in one line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def serve(family, mode):
    model, x = make(family, 0)
    t = torch.randint(0, 64, (BATCH * 32,)) if family == "decoder" else torch.randint(0, CLASSES, (BATCH,))
    if mode == "compiled":
        try:
            model = torch.compile(model)
            train_steps(model, x, t, 3)  # compiles, then warms up
        except Exception as e:  # no C++ compiler, an op inductor cannot lower, ...
            print(json.dumps({"error": compile_error(e)}), flush=True)
            return
    else:
        train_steps(model, x, t, 3)
    print(json.dumps({"ready": True}), flush=True)
    # One optimizer for the whole session, as nanhunt's serve keeps one.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for line in sys.stdin:
        print(json.dumps({"times": train_steps(model, x, t, int(line), opt=opt)}), flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        return serve(sys.argv[2], sys.argv[3])
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    # An optional family (or `fuzz`) runs that one alone, so that the
    # script can pair each model with nanhunt's run of it in time.
    only = sys.argv[2] if len(sys.argv) > 2 else None
    # `nocompile`: side_by_side.sh times the compiled model in paired.py.
    compile_too = not (len(sys.argv) > 3 and sys.argv[3] == "nocompile")
    y = torch.randint(0, CLASSES, (BATCH,))
    next_tokens = torch.randint(0, 64, (BATCH * 32,))
    for family in ["cnn", "transformer", "rnn", "decoder", "encoder"]:
        if only is not None and family != only:
            continue
        model, x = make(family, 0)
        t = next_tokens if family == "decoder" else y
        train_steps(model, x, t, 3)  # warm-up
        plain = statistics.median(train_steps(model, x, t, steps))
        anomaly = statistics.median(train_steps(model, x, t, steps, anomaly=True))
        compiled, why = compiled_ms(family, x, t, steps) if compile_too else (None, "not timed here")
        print(json.dumps({"framework": "pytorch", "family": family, "ms_per_step": plain * 1e3,
                          "compiled_ms_per_step": compiled, "compile_error": why,
                          "detect_anomaly_overhead": anomaly / plain - 1.0}), flush=True)
    if only is not None and only != "fuzz":
        return
    # Fuzz workload: fresh model, fresh optimizer, 5 steps, repeated.
    t0, runs = time.perf_counter(), 0
    while time.perf_counter() - t0 < 5.0:
        model, x = make("cnn", runs)
        train_steps(model, x, y, 5)
        runs += 1
    print(json.dumps({"framework": "pytorch", "family": "fuzz_cnn_5_steps",
                      "steps_per_s": 5 * runs / (time.perf_counter() - t0)}), flush=True)


if __name__ == "__main__":
    main()
