#!/usr/bin/env python3
"""Data-parallel scaling of GPT-2 124M through `colossal train`, beside PyTorch DDP's, in one call on
one machine (issue 17's table; docs/benchmarks.md).

    bench/compare/dp_scaling.py --colossal build-gpu/src/colossal/cli/colossal [--gpus 1,2]
                                [--steps 300] [--warmup 100] [--no-torch] [--out DIR]
                                [--rounds R] [--each-gpu] [--no-ours] [--set KEY=VALUE ...]
                                [--variant NAME:KEY=VALUE,... ...] [--baseline-set KEY=VALUE ...]

Ours: `colossal train --config configs/gpt2_tokens.toml` (one GPU) and `colossal run --nproc_per_node
N -- colossal train ...` with bf16 (fp32 masters), data.batch_size 16 x T 1024 per GPU,
gradient_accumulation 1, no clipping, dropout 0, on a file of random tokens made here, bounded by
train.max_steps. Time per step: the metrics file's step lines carry wall_s (seconds since training
began, read when the line is written, which waits for the step); ms/step is the slope between the
first logged step at or after --warmup and the last. Torch: bench/compare/ddp_step.py under torchrun,
the same shapes (its own timing over --steps after --warmup). Scaling = t(1 GPU) / t(N GPUs): the
fraction of N x one GPU's throughput that N GPUs keep (per-GPU batch fixed).

--rounds R runs the whole list R times, alternating the sizes (1, 2, 1, 2, ...), and reports each
size's median, so that a drift of the machine over the call falls on every size alike. --each-gpu runs
the one-GPU baseline on each GPU the largest run uses (CUDA_VISIBLE_DEVICES), since GPUs of one machine
differ by ~1% in speed and a synchronous job runs at its slowest one's pace: the baseline is then their
mean throughput (N GPUs ideally give the sum of what each gives alone), and each GPU's is printed.
--set KEY=VALUE (repeatable) is handed to our runs on more than one GPU (`zero.stage=1`, say), the
one-GPU baseline staying the plain run. --variant NAME:KEY=VALUE,... (repeatable; "plain:" for none)
runs each variant's multi-GPU runs in every round against the one shared one-GPU baseline, so that, e.g.,
`--variant plain: --variant zero1:zero.stage=1` gives plain data parallelism, ZeRO-1 and (without
--no-torch) DDP in one table from one call; --set then applies to every variant. --baseline-set
KEY=VALUE (repeatable) is handed to the one-GPU runs only (`zero.stage=0` keeps the baseline plain where
the config itself sets ZeRO; `zero.stage=1` times ZeRO-1 in one process against a plain run)."""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def make_tokens(path, count=4_000_000, vocab=50257):
    import numpy as np

    rng = np.random.default_rng(7)
    rng.integers(0, vocab, size=count, dtype=np.uint16).tofile(path)


def ours(colossal, gpus, steps, warmup, out, device=None, sets=(), variant=""):
    tag = (f"{gpus}" if device is None else f"1_gpu{device}") + (f"_{variant}" if variant else "")
    metrics = os.path.join(out, f"ours_{tag}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    train = [colossal, "train", "--config", os.path.join(ROOT, "configs", "gpt2_tokens.toml"),
             "--set", f"data.path=\"{os.path.join(out, 'tokens.bin')}\"", "--set", "data.test_path=\"\"",
             "--set", "data.batch_size=16", "--set", "gradient_accumulation=1", "--set", "clip_grad_norm=0.0",
             "--set", "bf16=true", "--set", "model.options={ vocab_multiple = 64, dropout = 0.0 }",
             "--set", f"train.max_steps={steps}", "--set", "train.log_interval=10", "--set", "train.progress=false",
             "--set", "lr_scheduler.warmup_steps=10", "--metrics", metrics]
    for kv in sets:
        train += ["--set", kv]
    command = train if gpus == 1 else [colossal, "run", "--nproc_per_node", str(gpus), "--"] + train
    log = os.path.join(out, f"ours_{tag}.log")
    with open(log, "w") as f:
        rc = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=run_env(device)).returncode
    if rc != 0:
        print(open(log).read()[-4000:])
        raise SystemExit(f"colossal train on {gpus} GPU(s) failed (rc {rc}); log {log}")
    points = []
    for line in open(metrics):
        j = json.loads(line)
        if j.get("event") == "step" and "wall_s" in j:
            points.append((j["step"], j["wall_s"]))
    points = [p for p in points if p[0] >= warmup]
    if len(points) < 2:
        raise SystemExit(f"too few step lines after warm-up in {metrics}")
    (s0, t0), (s1, t1) = points[0], points[-1]
    ms = 1e3 * (t1 - t0) / (s1 - s0)
    return dict(impl="colossal", gpus=gpus, device=device, variant=variant, ms_per_step=ms,
                tokens_per_s=gpus * 16 * 1024 / (ms * 1e-3), steps_timed=s1 - s0)


def run_env(device):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(device)
    return env


def torch_ddp(gpus, steps, warmup, out, device=None):
    torchrun = shutil.which("torchrun") or None
    command = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
        "--standalone", f"--nproc_per_node={gpus}", os.path.join(HERE, "ddp_step.py"), "--steps", str(steps - warmup),
        "--warmup", str(warmup)]
    result = subprocess.run(command, capture_output=True, text=True, env=run_env(device))
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
        raise SystemExit(f"torch DDP on {gpus} GPU(s) failed")
    rows = [json.loads(l) for l in result.stdout.splitlines() if l.startswith("{")]
    return dict(rows[-1], device=device)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--colossal", required=True)
    parser.add_argument("--gpus", default="1,2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-ours", action="store_true", help="only torch DDP's runs")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/dp-scaling"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--each-gpu", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for our runs on more than one GPU (repeatable)")
    parser.add_argument("--baseline-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for our one-GPU runs (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="a named set of overrides for our multi-GPU runs (repeatable; 'plain:' for none)")
    args = parser.parse_args()
    variants = []  # (name, overrides)
    for spec in args.variant:
        name, sep, rest = spec.partition(":")
        if not sep or not name or not name.isidentifier():
            parser.error(f"--variant '{spec}': expected NAME:KEY=VALUE,... (NAME a word; 'plain:' for no overrides)")
        overrides = [kv for kv in rest.split(",") if kv]
        bad = [kv for kv in overrides if "=" not in kv]
        if bad:
            parser.error(f"--variant '{spec}': '{bad[0]}' is not KEY=VALUE")
        variants.append((name, overrides + args.set))
    if not variants:
        variants = [("", args.set)]
    os.makedirs(args.out, exist_ok=True)
    make_tokens(os.path.join(args.out, "tokens.bin"))
    gpus = [int(g) for g in args.gpus.split(",")]
    # One GPU: on each GPU the largest run uses (--each-gpu), or where CUDA_VISIBLE_DEVICES points.
    singles = list(range(max(gpus))) if args.each_gpu else [None]
    rows = []
    for _ in range(args.rounds):
        for n in gpus:
            for device in (singles if n == 1 else [None]):
                runs = [] if args.no_ours else [
                    (lambda v=v: ours(args.colossal, n, args.steps, args.warmup, args.out, device, v[1], v[0]))
                    for v in (variants if n > 1 else [("", args.baseline_set)])]
                if not args.no_torch:
                    runs.append(lambda: torch_ddp(n, args.steps, args.warmup, args.out, device))
                for run in runs:
                    rows.append(run())
                    print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(args.out, "dp-scaling.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

    def median(values):
        values = sorted(values)
        return values[len(values) // 2] if len(values) % 2 else 0.5 * (values[len(values) // 2 - 1] + values[len(values) // 2])

    print(f"\n{'impl':16} {'GPUs':>4} {'on':>4} {'ms/step':>9} {'tokens/s':>11} {'scaling':>8}   (median of {args.rounds})")
    for impl in ("colossal", "torch-ddp"):
        mine = [r for r in rows if r["impl"] == impl]
        if not mine:
            continue
        key = lambda r: (r["gpus"], r.get("device"), r.get("variant", ""))
        keys = sorted({key(r) for r in mine}, key=lambda k: (k[0], -1 if k[1] is None else k[1], k[2]))
        ms = {k: median([r["ms_per_step"] for r in mine if key(r) == k]) for k in keys}
        ones = [v for (n, _, _), v in ms.items() if n == 1]
        # The baseline: the one-GPU runs' mean throughput (their harmonic mean of ms/step).
        base = len(ones) / sum(1 / v for v in ones) if ones else float("nan")
        for (n, device, variant), v in ms.items():
            where = "all" if device is None else f"gpu{device}"
            name = f"{impl} {variant}" if variant else impl
            print(f"{name:16} {n:>4} {where:>4} {v:>9.2f} {n * 16 * 1024 / (v * 1e-3):>11.0f} {base / v:>8.3f}")
        if len(ones) > 1:
            print(f"{impl:16} {1:>4} {'mean':>4} {base:>9.2f} {16 * 1024 / (base * 1e-3):>11.0f} {1:>8.3f}")


if __name__ == "__main__":
    main()
