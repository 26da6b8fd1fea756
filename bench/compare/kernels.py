#!/usr/bin/env python3
"""Side-by-side GPU kernel timings: colossal's bench/kernels/gpu_kernels_bench against PyTorch on the
same GPU in the same run. Usage: bench/compare/kernels.py BUILD_DIR/bench/kernels/gpu_kernels_bench

Each row times the same operation at the same shape and dtype as the colossal row of that name
(median of 20 CUDA-event-timed calls after warm-up), and prints both with ratio = torch / colossal
time (above 1: colossal is faster). A second table gives each side's host time per call of common ops
on tiny tensors (the GPU idle), timed as gpu_kernels_bench's host_us."""
import json
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


def time_ms(fn, reps=20, calls=10):
    """Median per-call time over reps samples of `calls` back-to-back calls, as gpu_kernels_bench
    times ours (see its time_ms: one call between events also times the host's launch gap)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / calls)
    samples.sort()
    return samples[len(samples) // 2]


def host_us(fn, reps=15, batch=200):
    """Median host microseconds per call over reps batches of back-to-back calls on tiny tensors,
    synchronised between batches (outside the timed part), as gpu_kernels_bench's host_us."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - start) / batch * 1e6)
        torch.cuda.synchronize()
    samples.sort()
    return samples[len(samples) // 2]


def torch_host_rows():
    dev, bf16 = "cuda", torch.bfloat16
    with torch.no_grad():
        x = torch.rand(8, 1024, device=dev, dtype=bf16) * 2 - 1
        other = torch.rand(8, 1024, device=dev, dtype=bf16) * 2 - 1
        w = torch.rand(1024, device=dev, dtype=bf16)
        b = torch.rand(1024, device=dev, dtype=bf16)
        weight = torch.rand(1024, 1024, device=dev, dtype=bf16)
        return {
            "host: empty [8,1024] bf16": host_us(lambda: torch.empty(8, 1024, device=dev, dtype=bf16)),
            "host: add [8,1024] bf16": host_us(lambda: torch.add(x, other)),
            "host: gelu [8,1024] bf16": host_us(lambda: F.gelu(x)),
            "host: layer_norm [8,1024] bf16": host_us(lambda: F.layer_norm(x, (1024,), w, b)),
            "host: linear [8,1024]x[1024,1024] bf16": host_us(lambda: F.linear(x, weight, b)),
        }


def torch_rows():
    dev = "cuda"
    bf16 = torch.bfloat16
    rows = {}
    with torch.no_grad():
        src = torch.rand(1 << 28, device=dev, dtype=bf16)
        dst = torch.empty_like(src)
        rows["ceiling: device copy 512 MiB"] = time_ms(lambda: dst.copy_(src))
        del src, dst
        # GEMM operands uniform in [-1, 1) as colossal's: tensor-core power (and so clocks) depends on the data.
        a = torch.rand(8192, 8192, device=dev, dtype=bf16) * 2 - 1
        b = torch.rand(8192, 8192, device=dev, dtype=bf16) * 2 - 1
        rows["ceiling: bf16 GEMM 8192^3"] = time_ms(lambda: torch.matmul(a, b))
        del a, b
        for name, m, k, n in [("gemm bf16 4096^3", 4096, 4096, 4096),
                              ("gemm bf16 gpt2 qkv 16384x768x2304", 16384, 768, 2304),
                              ("gemm bf16 gpt2 fc 16384x768x3072", 16384, 768, 3072),
                              ("gemm bf16 gpt2 proj 16384x3072x768", 16384, 3072, 768)]:
            a = torch.rand(m, k, device=dev, dtype=bf16) * 2 - 1
            b = torch.rand(k, n, device=dev, dtype=bf16) * 2 - 1
            rows[name] = time_ms(lambda: torch.matmul(a, b))
        x = torch.rand(16384, 768, device=dev, dtype=bf16)
        w = torch.rand(768, device=dev, dtype=bf16)
        bias = torch.rand(768, device=dev, dtype=bf16)
        rows["layer_norm fwd bf16 16384x768"] = time_ms(lambda: F.layer_norm(x, (768,), w, bias))
        big_x = torch.rand(65536, 1024, device=dev, dtype=bf16)
        big_w = torch.rand(1024, device=dev, dtype=bf16)
        big_b = torch.rand(1024, device=dev, dtype=bf16)
        rows["layer_norm fwd bf16 65536x1024"] = time_ms(lambda: F.layer_norm(big_x, (1024,), big_w, big_b))
        wide = torch.rand(16384, 3072, device=dev, dtype=bf16)
        rows["gelu fwd bf16 16384x3072"] = time_ms(lambda: F.gelu(wide, approximate="tanh"))
        vit = torch.rand(128 * 197, 3072, device=dev, dtype=bf16) * 8 - 4
        vit_grad = torch.rand(128 * 197, 3072, device=dev, dtype=bf16) * 2 - 1
        rows["gelu erf fwd bf16 25216x3072"] = time_ms(lambda: F.gelu(vit))
        rows["gelu erf bwd bf16 25216x3072"] = time_ms(
            lambda: torch.ops.aten.gelu_backward(vit_grad, vit, approximate="none"))
        del vit, vit_grad
        rows["dropout fwd bf16 16384x3072"] = time_ms(lambda: F.dropout(wide, 0.1, True))
        scores = torch.rand(8 * 12 * 1024, 1024, device=dev, dtype=bf16)
        rows["softmax fwd bf16 98304x1024"] = time_ms(lambda: torch.softmax(scores, -1))
        other = torch.rand(16384, 3072, device=dev, dtype=bf16)
        rows["add bf16 16384x3072"] = time_ms(lambda: torch.add(wide, other))
        n = 124_439_808
        p, m_, v = (torch.rand(n, device=dev) for _ in range(3))
        rows["adamw-style addcdiv_ f32 124M"] = time_ms(lambda: p.addcdiv_(m_, v, value=-1e-3))
        del p, m_, v
        block = [(768,), (768,), (768, 2304), (2304,), (768, 768), (768,),
                 (768,), (768,), (768, 3072), (3072,), (3072, 768), (768,)]
        shapes = [(50257, 768), (1024, 768)] + block * 12 + [(768,), (768,)]
        params = [(torch.rand(s, device=dev) * 2 - 1).requires_grad_() for s in shapes]
        for param in params:
            param.grad = torch.rand_like(param) * 2 - 1
        adamw = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, fused=True)
        rows["fused adamw step f32 gpt2-124M 148 tensors"] = time_ms(adamw.step)
        del params, adamw
        logits = torch.rand(8192, 50304, device=dev, dtype=bf16)
        targets = torch.randint(0, 50257, (8192,), device=dev)
        rows["cross_entropy fwd bf16 8192x50304"] = time_ms(lambda: F.cross_entropy(logits, targets))
    q, k, v = (torch.rand(8, 12, 1024, 64, device=dev, dtype=bf16, requires_grad=True) for _ in range(3))
    grad = torch.rand(8, 12, 1024, 64, device=dev, dtype=bf16)

    def attention():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    rows["attention fwd+bwd causal bf16 B8 H12 T1024 D64"] = time_ms(attention)
    mlp_x = torch.rand(16384, 768, device=dev, dtype=bf16, requires_grad=True)
    w1 = torch.empty(768, 3072, device=dev, dtype=bf16).uniform_(-0.05, 0.05).requires_grad_()
    b1 = torch.empty(3072, device=dev, dtype=bf16).uniform_(-0.5, 0.5).requires_grad_()
    w2 = torch.empty(3072, 768, device=dev, dtype=bf16).uniform_(-0.03, 0.03).requires_grad_()
    b2 = torch.empty(768, device=dev, dtype=bf16).uniform_(-0.5, 0.5).requires_grad_()
    mlp_grad = torch.rand(16384, 768, device=dev, dtype=bf16)

    def mlp():  # GPT-2's MLP as Hugging Face runs it: Conv1D weights [in, out], tanh GELU
        hidden = F.gelu(torch.addmm(b1, mlp_x, w1), approximate="tanh")
        torch.addmm(b2, hidden, w2).backward(mlp_grad)

    rows["gpt2 mlp fwd+bwd bf16 16384x768x3072 gelu_mlp"] = time_ms(mlp)
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.argv[1], "--json", f.name], check=True)
        ours = json.load(open(f.name))
    theirs = torch_rows()
    theirs_host = torch_host_rows()
    host = [row for row in ours if "host_us" in row]
    ours = [row for row in ours if "host_us" not in row]
    print(f"\n{torch.cuda.get_device_name()}  torch {torch.__version__}")
    # "kernel ms": our GPU work alone per call (CUPTI), without the launch gaps the events include.
    print(f"{'kernel':48s} {'colossal ms':>12s} {'torch ms':>10s} {'torch/colossal':>15s} {'kernel ms':>10s}")
    for row in ours:
        name = row["name"]
        t = theirs.get(name)
        kernel = f"{row['kernel_ms']:10.3f}" if row.get("kernel_ms") else ""
        if row["error"] is not None:
            print(f"{name:48s} {'n/a':>12s} {t if t is None else f'{t:10.3f}'}")
            continue
        ratio = f"{t / row['ms']:15.2f}" if t else " " * 15
        torch_ms = f"{t:10.3f}" if t is not None else " " * 10
        print(f"{name:48s} {row['ms']:12.3f} {torch_ms} {ratio} {kernel}")
    if host:
        print(f"\n{'host time per call (GPU idle)':48s} {'colossal us':>12s} {'torch us':>10s} {'torch/colossal':>15s}")
        for row in host:
            t = theirs_host.get(row["name"])
            torch_us = f"{t:10.2f}" if t is not None else " " * 10
            ratio = f"{t / row['host_us']:15.2f}" if t else ""
            print(f"{row['name']:48s} {row['host_us']:12.2f} {torch_us} {ratio}")


if __name__ == "__main__":
    main()
