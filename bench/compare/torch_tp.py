#!/usr/bin/env python3
"""PyTorch's own 1D tensor parallelism (DTensor's ColwiseParallel / RowwiseParallel plans) on a GPT, the
counterpart of `bench/compare/tp_mfu.sh` (issues 19 and 23): the same shapes, run in the same device call.

    torchrun --nproc_per_node N bench/compare/torch_tp.py [--layers 24] [--width 2048] [--heads 16]
             [--batch 8] [--seq 1024] [--steps 30] [--warmup 10] [--compile]

The model is train_step.py's nanoGPT-style GPT with q, k and v as three linears (a column split of the
fused c_attn would not hold whole heads per rank). Per block, as Megatron and the torchtitan recipe:
q, k, v and mlp.c_fc column-parallel, attn.c_proj and mlp.c_proj row-parallel; the embeddings, layer
norms and the tied head are replicated (the logits whole on every rank). A step is forward and loss under
torch.autocast(bf16) with fp32 parameters, backward, fused AdamW (one over the sharded DTensor
parameters, one over the replicated ones), zero_grad;
random tokens, the same on every rank (one data-parallel replica). Timed with CUDA events over --steps
after --warmup; rank 0 prints ms per step, tokens/s and MFU per GPU counting each GPU's share of
(6N + 12 L C T) FLOPs per token (N without wpe) against 989.4 TFLOP/s, as tp_mfu.sh does."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_bench import PADDED_VOCAB, add_shape_args, random_tokens, rank_device, speed, time_step_ms  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(parser, layers=24, width=2048, heads=16, batch=8)
    parser.add_argument("--compile", action="store_true", help="torch.compile each block")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world, rank, device = rank_device()
    mesh = init_device_mesh("cuda", (world,))
    L, C, H, T, V = args.layers, args.width, args.heads, args.seq, PADDED_VOCAB
    assert H % world == 0, f"{H} heads do not split over {world} ranks"

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
            self.c_proj = nn.Linear(C, C)

        def forward(self, x):
            B, T_, _ = x.shape
            # -1 heads: this rank's share after the column split.
            q, k, v = (p(x).view(B, T_, -1, C // H).transpose(1, 2) for p in (self.q, self.k, self.v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T_, -1))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.attn = Attention()
            self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    torch.manual_seed(1234)  # the same replicated weights on every rank
    model = GPT().to(device)
    for module in model.modules():  # GPT-2's N(0, 0.02) for every matrix and embedding (nanoGPT's init)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
    for block in model.h:
        parallelize_module(block, mesh, {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.c_proj": RowwiseParallel(), "c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()})
    if args.compile:
        for i, block in enumerate(model.h):
            model.h[i] = torch.compile(block)
    # Fused AdamW takes DTensor and plain parameters only apart (a mixed list is an error): one each.
    from torch.distributed.tensor import DTensor
    sharded = [p for p in model.parameters() if isinstance(p, DTensor)]
    replicated = [p for p in model.parameters() if not isinstance(p, DTensor)]
    optimizers = [torch.optim.AdamW(ps, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
                  for ps in (sharded, replicated)]
    idx, targets = random_tokens(args, device)

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(idx, targets)
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    ms, loss = time_step_ms(step, args, device)
    if rank == 0:
        print(f"torch DTensor tp={world} GPT L{L} C{C} H{H} B{args.batch} T{T}{' compiled' if args.compile else ''}: "
              f"{speed(args, ms, world)}, loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
