#!/usr/bin/env python3
"""PyTorch's whole training step for the models and shapes of bench/train_step_bench.cpp, to set
beside ours on the same GPU (bench/compare/train_steps.py runs both and prints the table).

    train_step.py --model gpt2 --mode eager|compile [--batch B] [--seq T] [--steps N] [--warmup N]
                  [--peak-tflops F] [--json FILE] [--dropout P]
    train_step.py --flops-only [--model NAME|all]     # FLOPs per step and parameters; no torch needed

Models: gpt2 (B16 T1024), gpt2-medium (B8 T1024), vit_base_patch16_224 (B128), vit_large_patch16_224
(B64), resnet50 (B128), all. A step is what ours times (docs/benchmarks.md): forward and loss under
torch.autocast(bf16) with fp32 parameters, backward, torch.optim.AdamW(fused=True).step() and
zero_grad(set_to_none=True). GPT-2 is a nanoGPT-style model written here (tied embeddings,
F.scaled_dot_product_attention causal, tanh GELU, vocabulary padded to 50304, no dropout unless
--dropout P: then GPT-2's own dropouts as nanoGPT has them, after the embeddings, on the attention
probabilities inside scaled_dot_product_attention, after each block's two projections); ViT is
timm's, ResNet-50 torchvision's (else timm's) in channels_last with cudnn.benchmark on. --mode compile wraps the
model and its loss in torch.compile (mode "default"); a compile failure is reported in the row.
Timing: CUDA events around --steps back-to-back steps after --warmup steps, one synchronize at the
end. Peak memory: torch.cuda.max_memory_allocated after reset_peak_memory_stats before the timed steps.
Each run writes one JSON object per line with the fields of train_step_bench --json."""
import argparse
import gc
import json
import sys
import time

DEFAULT_PEAK_TFLOPS = 989.4  # H100 SXM dense bf16 (the H200 has the same); as train_step_bench
MODEL_NAMES = ["gpt2", "gpt2-medium", "vit_base_patch16_224", "vit_large_patch16_224", "resnet50"]
DEFAULT_BATCH = {"gpt2": 16, "gpt2-medium": 8, "vit_base_patch16_224": 128, "vit_large_patch16_224": 64,
                 "resnet50": 128}
IMAGE_SIZE = 224
NUM_CLASSES = 1000

# ---- model shapes and FLOPs per step: the same formulas as train_step_bench.cpp (pure Python, so
# --flops-only runs without torch and the two programs can be checked against each other).


def gpt2_config(name):
    layers, width, heads = (12, 768, 12) if name == "gpt2" else (24, 1024, 16)
    # vocab: GPT-2's 50257 tokens; padded_vocab: rows of wte rounded up to a multiple of 64 (nanoGPT).
    return dict(n_layer=layers, n_embd=width, n_head=heads, n_positions=1024, vocab=50257, padded_vocab=50304)


def gpt2_num_params(c):
    """As GPT2Config::num_parameters: wte (padded, tied with the head), wpe, the blocks, ln_f."""
    d = c["n_embd"]
    return c["padded_vocab"] * d + c["n_positions"] * d + c["n_layer"] * (12 * d * d + 13 * d) + 2 * d


def gpt2_flops(c, batch, seq):
    """(6 N + 12 L d T) per token, N without the position embedding (PaLM appendix B, nanoGPT's
    estimate_mfu); the attention term counts the full T x T scores, not halved for the causal mask."""
    n = gpt2_num_params(c) - c["n_positions"] * c["n_embd"]
    return (6 * n + 12 * c["n_layer"] * c["n_embd"] * seq) * batch * seq


def vit_config(name):
    width, depth, heads = (768, 12, 12) if name == "vit_base_patch16_224" else (1024, 24, 16)
    return dict(embed_dim=width, depth=depth, num_heads=heads, patch=16, img=IMAGE_SIZE, in_chans=3,
                num_classes=NUM_CLASSES, mlp_ratio=4.0)


def vit_num_params(c):
    d, hidden = c["embed_dim"], int(c["embed_dim"] * c["mlp_ratio"])
    patches = (c["img"] // c["patch"]) ** 2
    patch = d * c["in_chans"] * c["patch"] ** 2 + d
    block = 4 * d + 3 * d * d + 3 * d + d * d + d + hidden * d + hidden + hidden * d + d
    return patch + d + (1 + patches) * d + c["depth"] * block + 2 * d + c["num_classes"] * (d + 1)


def vit_flops(c, batch):
    """3 x the forward's matmul FLOPs from the layer shapes (patch projection; per block qkv, q k^T,
    p v, proj, fc1, fc2; the head on the class token)."""
    d, hidden = c["embed_dim"], int(c["embed_dim"] * c["mlp_ratio"])
    patches = (c["img"] // c["patch"]) ** 2
    tokens = patches + 1
    patch = 2 * patches * c["in_chans"] * c["patch"] ** 2 * d
    block = 2 * tokens * d * 3 * d + 4 * tokens * tokens * d + 2 * tokens * d * d + 4 * tokens * d * hidden
    head = 2 * d * c["num_classes"]
    return 3 * batch * (patch + c["depth"] * block + head)


def resnet50_flops(batch, image_size=IMAGE_SIZE):
    """3 x 2 x the multiply-accumulates of every conv and the fc (torchvision's ResNet-50 v1.5):
    4.09 G MACs = 8.18 GFLOPs forward per 224 image. Norms, ReLU, pooling and adds are not counted."""
    def out(size, kernel, stride, pad):
        return (size + 2 * pad - kernel) // stride + 1

    macs = 0
    hw = out(image_size, 7, 2, 3)
    macs += hw * hw * 64 * 3 * 49
    hw = out(hw, 3, 2, 1)
    in_planes = 64
    for stage, blocks in enumerate([3, 4, 6, 3]):
        planes = 64 << stage
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            o = out(hw, 3, stride, 1)
            macs += hw * hw * planes * in_planes + o * o * planes * planes * 9 + o * o * planes * 4 * planes
            if stride != 1 or in_planes != planes * 4:
                macs += o * o * planes * 4 * in_planes
            in_planes, hw = planes * 4, o
    macs += in_planes * NUM_CLASSES
    return 3 * batch * 2 * macs


RESNET50_PARAMS = 25_557_032  # torchvision's resnet50(num_classes=1000)


def case(name, args):
    """The shape and FLOPs of one model at the command line's sizes."""
    batch = args.batch or DEFAULT_BATCH[name]
    if name.startswith("gpt2"):
        c = gpt2_config(name)
        seq = args.seq or 1024
        return dict(model=name, batch=batch, seq=seq, image_size=None, params=gpt2_num_params(c),
                    flops_per_step=gpt2_flops(c, batch, seq), flop_formula="(6N + 12 L d T) x tokens, N without wpe",
                    throughput_unit="tokens/s", samples=batch * seq)
    if name.startswith("vit"):
        c = vit_config(name)
        return dict(model=name, batch=batch, seq=None, image_size=IMAGE_SIZE, params=vit_num_params(c),
                    flops_per_step=vit_flops(c, batch), flop_formula="3 x forward matmul FLOPs from layer shapes",
                    throughput_unit="images/s", samples=batch)
    return dict(model=name, batch=batch, seq=None, image_size=IMAGE_SIZE, params=RESNET50_PARAMS,
                flops_per_step=resnet50_flops(batch), flop_formula="3 x 2 x conv/fc MACs from layer shapes",
                throughput_unit="images/s", samples=batch)


# ---- the PyTorch models (torch is imported only here, so --flops-only works without it)


def make_gpt2(c, dropout=0.0):
    """nanoGPT's GPT-2 (Karpathy's model.py, bias on, dropout `dropout`) returning the mean LM loss."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
            self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(C, dim=2)
            heads = c["n_head"]
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout if self.training else 0.0)
            return F.dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)), dropout, self.training)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])

        def forward(self, x):
            return F.dropout(self.c_proj(self.gelu(self.c_fc(x))), dropout, self.training)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(c["n_embd"], eps=1e-5)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(c["n_embd"], eps=1e-5)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(c["padded_vocab"], c["n_embd"])
            self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
            self.h = nn.ModuleList(Block() for _ in range(c["n_layer"]))
            self.ln_f = nn.LayerNorm(c["n_embd"], eps=1e-5)
            self.lm_head = nn.Linear(c["n_embd"], c["padded_vocab"], bias=False)
            self.wte.weight = self.lm_head.weight  # tied, as GPT-2's
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, std=0.02 / (2 * c["n_layer"]) ** 0.5)
                elif p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
                elif name.endswith("bias") and "ln" not in name:
                    nn.init.zeros_(p)

        def forward(self, ids, targets):
            pos = torch.arange(ids.size(1), device=ids.device)
            x = F.dropout(self.wte(ids) + self.wpe(pos), dropout, self.training)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def make_classifier(name):
    """timm's ViT or torchvision's ResNet-50, returning the mean cross-entropy of its logits."""
    import torch.nn as nn
    import torch.nn.functional as F

    if name.startswith("vit"):
        import timm
        net = timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES)
    else:
        try:
            import torchvision
            net = torchvision.models.resnet50(weights=None, num_classes=NUM_CLASSES)
        except ImportError:  # timm's resnet50 is the same network (v1.5, 25,557,032 parameters)
            import timm
            net = timm.create_model("resnet50", pretrained=False, num_classes=NUM_CLASSES)

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, images, labels):
            return F.cross_entropy(self.net(images), labels)

    return WithLoss()


def measure(row, mode, args):
    import torch

    row["stage"] = "building the model"
    torch.manual_seed(1234)
    device = torch.device("cuda")
    name = row["model"]
    if name.startswith("gpt2"):
        model = make_gpt2(gpt2_config(name), args.dropout)
    else:
        model = make_classifier(name)
    model = model.to(device).train()
    if name == "resnet50":
        # channels_last (NHWC) is how torchvision's ResNet trains fastest in bf16 on tensor cores, and
        # cudnn.benchmark picks convolution algorithms by timing them, as training scripts set it.
        model = model.to(memory_format=torch.channels_last)
        torch.backends.cudnn.benchmark = True
    row["params"] = sum(p.numel() for p in model.parameters())  # shared (tied) parameters counted once
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  fused=True)

    # Synthetic inputs, made once on the GPU, as ours.
    g = torch.Generator(device=device).manual_seed(42)
    if name.startswith("gpt2"):
        vocab = gpt2_config(name)["vocab"]
        shape = (row["batch"], row["seq"])
        inputs = torch.randint(0, vocab, shape, device=device, generator=g)
        targets = torch.randint(0, vocab, shape, device=device, generator=g)
    else:
        inputs = torch.randn(row["batch"], 3, IMAGE_SIZE, IMAGE_SIZE, device=device, generator=g)
        if name == "resnet50":
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        targets = torch.randint(0, NUM_CLASSES, (row["batch"],), device=device, generator=g)

    forward = torch.compile(model) if mode == "compile" else model

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = forward(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    # Warm-up: compilation (mode compile), cuDNN/cuBLAS algorithm choice, optimizer state, allocator.
    row["stage"] = "the first step (torch.compile compiles here)" if mode == "compile" else "the first step"
    t0 = time.perf_counter()
    loss = step()
    row["loss_first"] = loss.item()
    row["first_step_s"] = time.perf_counter() - t0  # includes torch.compile's compilation
    row["stage"] = "the warm-up steps"
    for _ in range(args.warmup - 1):
        loss = step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()

    row["stage"] = "the timed steps"
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall_start = time.perf_counter()
    start.record()
    for _ in range(args.steps):
        loss = step()
    stop.record()
    stop.synchronize()
    wall = time.perf_counter() - wall_start

    ms = start.elapsed_time(stop) / args.steps
    row["ms_per_step"] = ms
    row["wall_ms_per_step"] = 1e3 * wall / args.steps
    row["throughput"] = row["samples"] / (ms * 1e-3)
    row["tflops"] = row["flops_per_step"] / (ms * 1e-3) / 1e12
    row["mfu"] = row["flops_per_step"] / (ms * 1e-3) / (args.peak_tflops * 1e12)
    row["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    row["loss_last"] = loss.item()
    del row["stage"]


def run(name, mode, args):
    import torch

    row = case(name, args)
    row.update(impl="torch", mode=mode, precision="autocast bf16, fp32 parameters", optimizer="AdamW (fused=True)",
               steps=args.steps, warmup=args.warmup, peak_tflops=args.peak_tflops,
               device=torch.cuda.get_device_name(), torch_version=torch.__version__, error=None)
    try:
        measure(row, mode, args)
    except Exception as e:  # noqa: BLE001 - a failed compile or an OOM is a result to report
        first_line = str(e).splitlines()[0] if str(e) else ""
        row["error"] = f"failed in {row.pop('stage', '?')}: {type(e).__name__}: {first_line}"[:500]
    finally:
        gc.collect()
        if mode == "compile":
            torch._dynamo.reset()
        torch.cuda.empty_cache()
    del row["samples"]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="all", choices=MODEL_NAMES + ["all"])
    parser.add_argument("--mode", default="eager", choices=["eager", "compile"])
    parser.add_argument("--batch", type=int, default=None, help="overrides every selected model's batch")
    parser.add_argument("--seq", type=int, default=None, help="GPT-2 tokens per sequence (<= 1024)")
    parser.add_argument("--dropout", type=float, default=0.0, help="GPT-2's dropout probability (default 0)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS)
    parser.add_argument("--json", default=None, help="write one JSON object per line here")
    parser.add_argument("--flops-only", action="store_true", help="print FLOPs per step and parameters, no GPU")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1 or (args.batch is not None and args.batch < 1):
        parser.error("--steps, --warmup and --batch must be >= 1")
    if args.seq is not None and not 1 <= args.seq <= 1024:
        parser.error("--seq must be in [1, 1024]")
    names = MODEL_NAMES if args.model == "all" else [args.model]

    if args.flops_only:
        print(f"{'model':24s} {'shape':14s} {'params':>14s} {'GFLOP/step':>18s}  formula")
        for name in names:
            r = case(name, args)
            shape = f"B{r['batch']} T{r['seq']}" if r["seq"] else f"B{r['batch']} {r['image_size']}px"
            print(f"{name:24s} {shape:14s} {r['params']:14d} {r['flops_per_step'] / 1e9:18.1f}  {r['flop_formula']}")
        return 0

    import torch
    if not torch.cuda.is_available():
        sys.exit("train_step.py: no CUDA GPU")
    out = open(args.json, "w") if args.json else None
    failed = False
    for name in names:
        row = run(name, args.mode, args)
        failed = failed or row["error"] is not None
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        if row["error"]:
            print(f"torch {args.mode} {name}: {row['error']}", file=sys.stderr)
        else:
            print(f"torch {args.mode:7s} {name:24s} {row['ms_per_step']:9.2f} ms/step {row['throughput']:11.0f} "
                  f"{row['throughput_unit']:8s} MFU {100 * row['mfu']:5.1f}%  "
                  f"peak {row['peak_memory_bytes'] / 2**30:6.2f} GiB  loss {row['loss_last']:.3f}  "
                  f"(first step {row['first_step_s']:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
