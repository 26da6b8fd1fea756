#!/usr/bin/env python3
"""PyTorch's own pipeline parallelism (torch.distributed.pipelining: Schedule1F1B, or
ScheduleInterleaved1F1B with 2 chunks per rank) on GPT-2 350M, the counterpart of
`bench/compare/pipeline_bubble.sh`'s pp parts (issues 20 and 23): the same shapes, in the same call.

    torchrun --nproc_per_node P bench/compare/torch_pp.py [--layers 24] [--width 1024] [--heads 16]
             [--batch 16] [--seq 1024] [--microbatches 8] [--chunks 1] [--steps 30] [--warmup 10]

The model is a nanoGPT-style GPT-2 (bias on, no dropout) cut by pieces as ours: the embedding, each
block, and ln_f with the head and the loss, 2 + L pieces, in P x chunks contiguous stages, the blocks
shared out evenly (the extra ones to the earlier stages); the first stage holds wte for the lookup and
the last a separate head weight (torch.distributed.pipelining has no tied weights across stages).
bf16 weights (as our run's stage converted by mixed precision; no fp32 masters), AdamW (foreach), random
tokens. A step is the schedule's step over --microbatches microbatches of the batch, then the
optimizer. Timed with CUDA events over --steps after --warmup; rank 0 prints ms per step, tokens/s and
MFU per GPU (6N + 12 L C T FLOPs per token, N without wpe, against 989.4 TFLOP/s) as
pipeline_bubble.sh does."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_bench import PADDED_VOCAB, add_shape_args, random_tokens, rank_device, speed, time_step_ms  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(parser, layers=24, width=1024, heads=16, batch=16)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=1, help="model chunks per rank (2: interleaved 1F1B)")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    world, rank, device = rank_device()
    dist.init_process_group("nccl", device_id=device)
    L, C, H, T, V = args.layers, args.width, args.heads, args.seq, PADDED_VOCAB
    stages = world * args.chunks

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T_, _ = x.shape
            q, k, v = (t.view(B, T_, H, C // H).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T_, C))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Stage(nn.Module):
        """Pieces [begin, end) of: 0 the embedding, 1..L the blocks, L + 1 ln_f and the head."""

        def __init__(self, begin, end):
            super().__init__()
            self.embed = begin == 0
            self.head = end == L + 2
            if self.embed:
                self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for i in range(max(begin, 1), min(end, L + 1)))
            if self.head:
                self.ln_f, self.lm_head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

        def forward(self, x):
            if self.embed:
                x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x)) if self.head else x

    # Stage s holds pieces [bounds[s], bounds[s + 1]).
    base, extra = divmod(L + 2, stages)
    bounds = [0]
    for s in range(stages):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    # Rank r holds stages r, r + world, ... (the interleaved placement).
    mine = [s for s in range(stages) if s % world == rank]
    torch.manual_seed(1234 + rank)
    modules = [Stage(bounds[s], bounds[s + 1]).to(device=device, dtype=torch.bfloat16) for s in mine]
    for module in (sub for mod in modules for sub in mod.modules()):  # GPT-2's N(0, 0.02) (nanoGPT's init)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
    m = args.batch // args.microbatches
    example = lambda s: (torch.zeros(m, T, dtype=torch.long, device=device) if s == 0 else
                         torch.zeros(m, T, C, dtype=torch.bfloat16, device=device))
    pipeline_stages = [PipelineStage(mod, s, stages, device, input_args=(example(s),)) for mod, s in zip(modules, mine)]

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    if args.chunks == 1:
        schedule = Schedule1F1B(pipeline_stages[0], n_microbatches=args.microbatches, loss_fn=loss_fn)
    else:
        schedule = ScheduleInterleaved1F1B(pipeline_stages, n_microbatches=args.microbatches, loss_fn=loss_fn)
    params = [p for mod in modules for p in mod.parameters()]
    optimizer = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    idx, targets = random_tokens(args, device)

    def step():
        if rank == 0 and rank == (stages - 1) % world:
            schedule.step(idx, target=targets)
        elif rank == 0:
            schedule.step(idx)
        elif rank == (stages - 1) % world:
            schedule.step(target=targets)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    ms, _ = time_step_ms(step, args, device)
    if rank == 0:
        kind = "1F1B" if args.chunks == 1 else f"interleaved 1F1B, {args.chunks} chunks"
        print(f"torch pipelining pp={world} ({kind}) GPT L{L} C{C} B{args.batch} T{T}, {args.microbatches} "
              f"microbatches: {speed(args, ms, world)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
