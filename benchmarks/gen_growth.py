"""Generate a CUDA training script of a given length with a fixed density of
CUDA rewrites (default 400 per 1,000 lines), for benchmarks/bench_growth.py."""

from __future__ import annotations

import sys

HEADER = '''import torch
import torch.nn as nn


def make_model():
    return nn.Linear(8, 8)

'''

# one block: 10 lines, 4 of them rewritten by convert (.cuda() calls, "cuda" strings)
BLOCK = '''
def block_{k}(batch):
    a = batch.cuda()
    b = torch.zeros(8, device="cuda")
    c = (a + b).cuda()
    model = make_model().cuda()
    out = model(c)
    total = out.sum() * {k}
    return total
'''


def generate(lines: int) -> str:
    parts = [HEADER]
    k = 0
    while sum(p.count("\n") for p in parts) < lines:
        parts.append(BLOCK.format(k=k))
        k += 1
    return "".join(parts)


if __name__ == "__main__":
    sys.stdout.write(generate(int(sys.argv[1])))
