#!/usr/bin/env python3
"""The PyTorch side of the side-by-side benchmark (bench/side_by_side.sh).

The same three models as nanhunt's `--size large` cases, f32, batch 32,
Adam, cross-entropy, at one thread:
  cnn          3x32x32, two conv3x3(same)+relu+maxpool2 blocks (16, 32 channels),
               global average pooling, linear head (4 classes)
  transformer  tokens (vocab 64), seq 32, d 64, 4 heads, 2 pre-norm layers,
               GELU MLP x2, learned positions, final LayerNorm, mean pool, head
  rnn          LSTM, seq 32, input 16, hidden 64, head on the last hidden state
plus the fuzz workload (fresh 5-step CNN runs) and the cost of
torch.autograd.detect_anomaly per step. Prints one JSON object per line.
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


def make(family, seed):
    torch.manual_seed(seed)
    if family == "cnn":
        return Cnn(), torch.randn(BATCH, 3, 32, 32)
    if family == "transformer":
        return Transformer(), torch.randint(0, 64, (BATCH, 32))
    return Rnn(), torch.randn(BATCH, 32, 16)


def train_steps(model, x, y, steps, anomaly=False):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
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


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    y = torch.randint(0, CLASSES, (BATCH,))
    for family in ["cnn", "transformer", "rnn"]:
        model, x = make(family, 0)
        train_steps(model, x, y, 3)  # warm-up
        plain = statistics.median(train_steps(model, x, y, steps))
        anomaly = statistics.median(train_steps(model, x, y, steps, anomaly=True))
        print(json.dumps({"framework": "pytorch", "family": family, "ms_per_step": plain * 1e3,
                          "detect_anomaly_overhead": anomaly / plain - 1.0}), flush=True)
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
