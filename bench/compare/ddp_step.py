#!/usr/bin/env python3
"""PyTorch DDP's data-parallel GPT-2 step, the reference for our scaling (bench/compare/dp_scaling.py
runs it beside `colossal train` in the same device call).

    torchrun --nproc_per_node N bench/compare/ddp_step.py [--batch 16] [--seq 1024] [--steps 200]
             [--warmup 100] [--json FILE]

The model is train_step.py's nanoGPT-style GPT-2 124M (tied embeddings, SDPA, no dropout); a step is
forward and loss under torch.autocast(bf16) with fp32 parameters, backward (DDP's bucketed all-reduce
overlapping it, 25 MiB buckets, gradient_as_bucket_view), fused AdamW, zero_grad(set_to_none). The
data are random tokens made on the GPU. Steady state: CUDA events around --steps steps after --warmup
steps (the first steps of a data-parallel run vary from 46 to 80 ms). Rank 0 prints ms per step and
writes one JSON object."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import gpt2_config, make_gpt2  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="sequences per GPU per step")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(1234)
    c = gpt2_config("gpt2")
    model = make_gpt2(c).to(device).train()
    if world > 1:
        model = DDP(model, device_ids=[local], gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  fused=True)
    g = torch.Generator(device=device).manual_seed(42 + rank)
    inputs = torch.randint(0, c["vocab"], (args.batch, args.seq), device=device, generator=g)
    targets = torch.randint(0, c["vocab"], (args.batch, args.seq), device=device, generator=g)

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = time.perf_counter()
    start.record()
    for _ in range(args.steps):
        step()
    stop.record()
    stop.synchronize()
    wall = time.perf_counter() - wall
    ms = start.elapsed_time(stop) / args.steps
    if world > 1:
        # The slowest rank sets the pace.
        t = torch.tensor([ms], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ms = t.item()
    if rank == 0:
        row = dict(impl="torch-ddp", gpus=world, batch_per_gpu=args.batch, seq=args.seq, steps=args.steps,
                   warmup=args.warmup, ms_per_step=ms, wall_ms_per_step=1e3 * wall / args.steps,
                   tokens_per_s=world * args.batch * args.seq / (ms * 1e-3))
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
