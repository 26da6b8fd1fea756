#!/usr/bin/env python3
"""PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) on the shapes of bench/compare/zero_memory.sh's
ZeRO-3 runs, for the side-by-side: GPT-2 of --layers x --width (--heads), bf16 parameters with fp32
reduction (MixedPrecisionPolicy), AdamW, clip 1.0, B --batch x T 1024 per GPU, random tokens, one
fully_shard per block and one at the root (FSDP2's recipe, the same units as our ZeRO-3). Prints
ms/step (steps 10-30), tokens/s per GPU, MFU per GPU (6N + 12 L C T FLOPs per token, N without wpe,
against 989.4 TFLOP/s) and the peak memory per GPU (torch.cuda.max_memory_allocated).

  torchrun --nproc_per_node 2 bench/compare/fsdp2_step.py --layers 48 --width 1600 --heads 25
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.c_fc, self.c_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.c_proj(y)
        return x + self.c_out(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, layers, width, heads, vocab=50304, positions=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(positions, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--heads", type=int, default=25)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.manual_seed(0)
    model = GPT(args.layers, args.width, args.heads).cuda()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.h:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    T, L, C = 1024, args.layers, args.width
    n = L * (12 * C * C + 13 * C) + 50304 * C + 2 * C  # without wpe (the parameters are sharded: counted)
    times = []
    for step in range(1, args.steps + 1):
        ids = torch.randint(0, 50257, (args.batch, T + 1), device="cuda")
        loss = F.cross_entropy(model(ids[:, :-1]).float().view(-1, 50304), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter())
    first = min(10, len(times) - 2)
    ms = 1e3 * (times[-1] - times[first - 1]) / (len(times) - first)
    tokens = args.batch * T / ms * 1e3
    mfu = (6 * n + 12 * L * C * T) * tokens / 989.4e12
    peak = torch.cuda.max_memory_allocated() / 2**30
    if rank == 0:
        print(f"FSDP2 GPT L{L} C{C} B{args.batch} T{T} on {dist.get_world_size()} GPUs: {ms:.1f} ms/step, "
              f"{tokens:.0f} tokens/s per GPU, MFU per GPU {mfu:.1%}, peak {peak:.2f} GiB per GPU")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
