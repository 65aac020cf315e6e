#!/usr/bin/env python3
"""The baseline of `slowmo bench step`: the same three models in PyTorch,
one training step (forward, backward, optimizer) timed the same way: the
same batch of random data each step, untimed warm-up steps, then the median
and the fastest of the timed steps.

- mlp: 784-256-10, ReLU; SGD lr 0.01, momentum 0.9; batch 32 of 28x28x1.
- cnn: LeNet-5 (conv 5x5x6 padding 2, max-pool 2, ReLU, conv 5x5x16,
  max-pool 2, ReLU, fc 120, fc 84, fc 10, ReLU between); SGD as above.
- transformer: GPT-2 style, pre-norm, causal attention
  (scaled_dot_product_attention), GELU (erf) MLP of 4x width, learned
  positions, head tied to the token embedding, vocabulary 256; Adam lr
  1e-3; batch 16 windows of 64 tokens by default.

Not run by CI. Needs PyTorch (CPU is enough), from PyPI:

    python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch numpy
    /tmp/torch/bin/python tools/bench/torch_step.py --threads 1

and beside it, on the same machine and thread count:

    RAYON_NUM_THREADS=1 target/release/slowmo bench step

Prints a Markdown table with the columns of `slowmo bench step`.
`--device cuda:0` times the step on a GPU (beside `slowmo bench step
--device cuda:0` from a CUDA build), waiting for the GPU after each step.
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Gpt(nn.Module):
    def __init__(self, layers, heads, width, context, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def time_steps(model, opt, batch, loss_of, warmup, steps, device):
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_of(model, batch).backward()
        opt.step()
        if device.type == "cuda":
            # the step has finished on the GPU, as slowmo's has when its
            # gradient reaches the host
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,transformer")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N")
    a = ap.parse_args()
    device = torch.device(a.device)
    torch.set_num_threads(a.threads)
    torch.manual_seed(7)
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} thread(s), {device}")
    print("| model | device | parameters | batch | threads | optimizer | median step | best step |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        if name == "transformer":
            batch = a.batch or 16
            model = Gpt(a.layers, a.heads, a.width, a.context).to(device)
            tokens = torch.randint(0, 256, (batch, a.context + 1), device=device)
            data = (tokens[:, :-1], tokens[:, 1:])
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            label = "adam"

            def loss_of(m, d):
                logits = m(d[0])
                return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), d[1].reshape(-1))
        else:
            batch = a.batch or 32
            model = (Mlp() if name == "mlp" else LeNet()).to(device)
            data = (
                torch.rand(batch, 1, 28, 28, device=device) * 2 - 1,
                torch.randint(0, 10, (batch,), device=device),
            )
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            label = "SGD, momentum 0.9"

            def loss_of(m, d):
                return F.cross_entropy(m(d[0]), d[1])

        params = sum(p.numel() for p in model.parameters())
        median, best = time_steps(model, opt, data, loss_of, a.warmup, a.steps, device)
        print(f"| {name} | {device} | {params} | {batch} | {a.threads} | {label} | {median:.2f} ms | {best:.2f} ms |")
        assert math.isfinite(median)


if __name__ == "__main__":
    main()
