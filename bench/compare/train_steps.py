#!/usr/bin/env python3
"""Whole training steps, ours and PyTorch's, on the same GPU in the same call: runs
train_step_bench (ours) and bench/compare/train_step.py (torch eager and torch.compile) for each
model, one process at a time, and prints a side-by-side table with throughput ratios.

    bench/compare/train_steps.py [--bench PATH] [--models all|NAME,NAME] [--modes eager,compile]
                                 [--steps N] [--warmup N] [--peak-tflops F] [--jsonl FILE]

--bench defaults to the first of build-gpu/ (tools/gpu-check's), build-cuda/ and build/ holding
bench/train_step/train_step_bench. Without torch (or without the binary) it prints the side it has.
Each (model, implementation) runs in its own process, so memory, caches and a failed compile do not
carry over; with torch.compile's compilation a full run of five models takes several minutes.
Ratios are throughput ours / theirs (= their ms / our ms): above 1 we are faster."""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODELS = ["gpt2", "gpt2-medium", "vit_base_patch16_224", "vit_large_patch16_224", "resnet50"]
BUILD_DIRS = ["build-gpu", "build-cuda", "build"]


def find_bench(path):
    if path:
        return path if os.access(path, os.X_OK) else None
    for build in BUILD_DIRS:
        candidate = os.path.join(ROOT, build, "bench", "train_step", "train_step_bench")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def torch_available():
    probe = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                           capture_output=True, text=True)
    return probe.returncode == 0


def run_json(command, timeout):
    """Runs a benchmark that writes JSON lines to the file named by its last argument; returns its
    rows, or one error row built from its output when it wrote none."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        path = f.name
    try:
        print("$ " + " ".join(shlex.quote(a) for a in command + [path]), flush=True)
        try:
            proc = subprocess.run(command + [path], capture_output=True, text=True, timeout=timeout)
            output = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            output = f"timed out after {timeout} s"
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        # Each result as soon as it exists: a call cut short by a time limit keeps what it measured.
        for row in rows:
            print("  -> " + json.dumps(row, sort_keys=True), flush=True)
        if rows:
            return rows
        tail = " | ".join(line for line in output.strip().splitlines()[-3:])
        return [{"error": f"no result: {tail}"[:300]}]
    finally:
        os.unlink(path)


def fmt_ms(row):
    return f"{row['ms_per_step']:.1f}" if row and not row.get("error") else "n/a"


def fmt_mfu(row):
    return f"{100 * row['mfu']:.1f}%" if row and not row.get("error") else "n/a"


def fmt_mem(row):
    return f"{row['peak_memory_bytes'] / 2**30:.1f}" if row and not row.get("error") else "n/a"


def fmt_ratio(ours, theirs):
    if not ours or not theirs or ours.get("error") or theirs.get("error"):
        return "n/a"
    return f"{theirs['ms_per_step'] / ours['ms_per_step']:.2f}x"


def print_table(results, modes, have_ours):
    """A Markdown table (readable as it is, and pasted into docs/benchmarks.md)."""
    impls = (["colossal"] if have_ours else []) + modes
    label = {"colossal": "ours", "eager": "eager", "compile": "compile"}
    header = ["model", "shape", "unit"]
    header += [f"{label[i]} ms" for i in impls]
    header += [f"{label[i]} thru" for i in impls]
    if have_ours:
        header += [f"ours/{m}" for m in modes]
    header += [f"MFU {label[i]}" for i in impls]
    header += [f"GiB {label[i]}" for i in impls]
    lines = []
    for name, rows in results.items():
        any_row = next((r for r in rows.values() if r and "batch" in r), None)
        if any_row is None:
            shape, unit = "", ""
        elif any_row.get("seq"):
            shape, unit = f"B{any_row['batch']} T{any_row['seq']}", "tok/s"
        else:
            shape, unit = f"B{any_row['batch']} {any_row['image_size']}px", "img/s"
        line = [name, shape, unit]
        line += [fmt_ms(rows.get(i)) for i in impls]
        line += [f"{rows[i]['throughput']:.0f}" if rows.get(i) and not rows[i].get("error") else "n/a" for i in impls]
        if have_ours:
            line += [fmt_ratio(rows.get("colossal"), rows.get(m)) for m in modes]
        line += [fmt_mfu(rows.get(i)) for i in impls]
        line += [fmt_mem(rows.get(i)) for i in impls]
        lines.append(line)
    widths = [max(len(h), *(len(l[k]) for l in lines)) for k, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |")
    errors = [(name, impl, r["error"]) for name, rows in results.items() for impl, r in rows.items()
              if r and r.get("error")]
    for name, impl, error in errors:
        print(f"  {name} {label[impl]}: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=None, help="path of train_step_bench")
    parser.add_argument("--models", default="all", help="all, or a comma-separated list of " + ", ".join(MODELS))
    parser.add_argument("--modes", default="eager,compile", help="torch modes: eager, compile, both or none ('')")
    parser.add_argument("--batch", type=int, default=None, help="overrides every selected model's batch, both sides")
    parser.add_argument("--seq", type=int, default=None, help="GPT-2 tokens per sequence (<= 1024), both sides")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.4)
    parser.add_argument("--timeout", type=int, default=900, help="seconds for one (model, implementation) run")
    parser.add_argument("--jsonl", default=None, help="also write every row here, one JSON object per line")
    args = parser.parse_args()
    models = MODELS if args.models == "all" else [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            parser.error(f"unknown model '{m}' (choose from {', '.join(MODELS)})")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("eager", "compile"):
            parser.error(f"unknown torch mode '{m}' (eager, compile)")

    bench = find_bench(args.bench)
    if bench is None:
        print("train_steps: train_step_bench not found (build it: ninja -C build-gpu train_step_bench, or pass "
              "--bench); showing torch only", flush=True)
    if modes and not torch_available():
        print("train_steps: torch with CUDA is not importable here; showing ours only", flush=True)
        modes = []
    if bench is None and not modes:
        sys.exit("train_steps: nothing to run")

    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--peak-tflops", str(args.peak_tflops)]
    if args.batch is not None:
        common += ["--batch", str(args.batch)]
    if args.seq is not None:
        common += ["--seq", str(args.seq)]
    results = {}
    for name in models:
        rows = {}
        # Ours first, then torch's, one process each and never two at a time on the GPU.
        if bench:
            rows["colossal"] = run_json([bench, "--model", name] + common + ["--json"], args.timeout)[0]
        for mode in modes:
            script = os.path.join(HERE, "train_step.py")
            rows[mode] = run_json([sys.executable, script, "--model", name, "--mode", mode] + common + ["--json"],
                                  args.timeout)[0]
        results[name] = rows

    all_rows = [r for rows in results.values() for r in rows.values() if r]
    device = next((r["device"] for r in all_rows if r.get("device")), "unknown GPU")
    torch_version = next((r["torch_version"] for r in all_rows if r.get("torch_version")), None)
    print()
    print(f"Whole training steps on {device}, {datetime.date.today().isoformat()}"
          + (f", torch {torch_version}" if torch_version else ""))
    print(f"bf16 with fp32 master weights, AdamW; {args.warmup} warm-up + {args.steps} timed steps; "
          f"MFU against {args.peak_tflops} TFLOP/s; ratios = throughput ours / theirs (above 1: ours faster)")
    print("command: " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]))
    print()
    print_table(results, modes, bench is not None)
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            for r in all_rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
