#!/usr/bin/env python3
"""Collective bandwidth, ours and torch.distributed's (NCCL backend), on the same GPUs in the same call.

Driver (the default): runs our comm_bench under `colossal run --nproc_per_node N --backend processes`,
then this file's worker under torchrun (python -m torch.distributed.run --standalone), and prints one
table: per op, dtype and size the time per call and bus bandwidth of each, and ours / torch's.

    bench/compare/collectives.py [--nproc N] [--build DIR] [--sizes-mib 1,16,256] [--dtypes bf16,f32]
                                 [--ops all_reduce,reduce_scatter,all_gather] [--warmup 10]
                                 [--iters 50] [--jsonl FILE]

Worker (one process per GPU, started by torchrun): torch.distributed's side alone; rank 0 prints it.

    torchrun --nproc_per_node N bench/compare/collectives.py --worker [--jsonl FILE] [same options]

Both sides measure alike: full buffer of the size asked for (its length rounded down to a multiple
of N), zeros; --warmup untimed calls; a barrier with the host waiting; --iters synchronous calls
between two CUDA events on the current stream (a synchronous collective makes that stream wait for
the communication stream, so the end event follows the last collective); the slowest rank's time.
algbw = bytes / time with bytes the full (unsharded) buffer; busbw (NCCL's convention) = algbw *
2(n-1)/n for all_reduce, algbw * (n-1)/n for reduce_scatter and all_gather. GB/s = 1e9 bytes/s.
--build defaults to the first of build-multigpu/, build-gpu/ (tools/gpu-check's), build-cuda/ and
build/ holding both src/colossal/cli/colossal and bench/comm/comm_bench. Without torch it prints ours."""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD_DIRS = ["build-multigpu", "build-gpu", "build-cuda", "build"]
OPS = ["all_reduce", "reduce_scatter", "all_gather"]
DTYPES = {"bf16": 2, "f32": 4, "f16": 2, "f64": 8}
# NVLink multicast stays off on the shared machines; each side gets the same settings.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help="measure torch.distributed (under torchrun)")
    p.add_argument("--nproc", type=int, default=0, help="ranks, one GPU each (default: every visible GPU)")
    p.add_argument("--build", default="", help="build folder with colossal and bench/comm/comm_bench")
    p.add_argument("--sizes-mib", default="1,16,256")
    p.add_argument("--dtypes", default="bf16,f32")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--jsonl", default="", help="write every row (both sides in driver mode) as JSON lines")
    p.add_argument("--timeout", type=int, default=600, help="seconds each side may run")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes_mib.split(",") if s]
    args.dtype_list = [d for d in args.dtypes.split(",") if d]
    args.op_list = [o for o in args.ops.split(",") if o]
    for d in args.dtype_list:
        if d not in DTYPES:
            p.error(f"unknown dtype {d}; valid: {', '.join(DTYPES)}")
    for o in args.op_list:
        if o not in OPS:
            p.error(f"unknown op {o}; valid: {', '.join(OPS)}")
    if args.warmup < 1 or args.iters < 1 or not args.sizes or min(args.sizes) < 1:
        p.error("--warmup, --iters and every size must be at least 1")
    return args


def bus_factor(op, n):
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def shared_flags(args):
    return ["--sizes-mib", args.sizes_mib, "--dtypes", args.dtypes, "--ops", args.ops,
            "--warmup", str(args.warmup), "--iters", str(args.iters)]


# ---- worker: torch.distributed --------------------------------------------------------------------

def worker(args):
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    # device_id binds the process group to this GPU and connects NCCL at once, as our world does.
    dist.init_process_group("nccl", device_id=device)
    rank, n = dist.get_rank(), dist.get_world_size()
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16, "f64": torch.float64}
    out = open(args.jsonl, "w") if rank == 0 and args.jsonl else None
    if rank == 0:
        print(f"torch.distributed: {n} ranks over NCCL {'.'.join(map(str, torch.cuda.nccl.version()))} "
              f"({torch.cuda.get_device_name(device)}), torch {torch.__version__}, "
              f"{args.warmup} warm-up + {args.iters} timed calls per row", flush=True)
        print(f"{'op':<15} {'dtype':>5} {'MiB':>8} {'us/call':>12} {'algbw GB/s':>12} {'busbw GB/s':>12}", flush=True)
    for op in args.op_list:
        for dtype_name in args.dtype_list:
            for size_mib in args.sizes:
                element = DTYPES[dtype_name]
                numel = size_mib * (1 << 20) // element
                numel -= numel % n
                full = torch.zeros(numel, dtype=dtypes[dtype_name], device=device)
                shard = torch.zeros(numel // n, dtype=dtypes[dtype_name], device=device)

                def call():
                    if op == "all_reduce":
                        dist.all_reduce(full, op=dist.ReduceOp.SUM)
                    elif op == "reduce_scatter":
                        dist.reduce_scatter_tensor(shard, full, op=dist.ReduceOp.SUM)
                    else:
                        dist.all_gather_into_tensor(full, shard)

                for _ in range(args.warmup):
                    call()
                dist.barrier()
                torch.cuda.synchronize(device)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.iters):
                    call()
                end.record()
                end.synchronize()
                slowest = torch.tensor([start.elapsed_time(end) / args.iters], dtype=torch.float64, device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                ms = slowest.item()
                if rank != 0:
                    continue
                nbytes = numel * element
                algbw = nbytes / (ms * 1e-3) / 1e9
                busbw = algbw * bus_factor(op, n)
                print(f"{op:<15} {dtype_name:>5} {size_mib:>8} {ms * 1e3:>12.1f} {algbw:>12.1f} {busbw:>12.1f}",
                      flush=True)
                if out:
                    out.write(json.dumps({
                        "impl": "torch", "op": op, "dtype": dtype_name, "size_mib": size_mib, "bytes": nbytes,
                        "world_size": n, "warmup": args.warmup, "iters": args.iters, "time_us": ms * 1e3,
                        "algbw_gbps": algbw, "busbw_gbps": busbw, "gpu": torch.cuda.get_device_name(device),
                        "torch": torch.__version__}) + "\n")
                    out.flush()
    if out:
        out.close()
    dist.destroy_process_group()
    return 0


# ---- driver ---------------------------------------------------------------------------------------

def find_build(path):
    candidates = [path] if path else [os.path.join(ROOT, b) for b in BUILD_DIRS]
    for build in candidates:
        colossal = os.path.join(build, "src", "colossal", "cli", "colossal")
        bench = os.path.join(build, "bench", "comm", "comm_bench")
        if os.access(colossal, os.X_OK) and os.access(bench, os.X_OK):
            return colossal, bench
    return None, None


def torch_available():
    probe = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                           capture_output=True, text=True)
    return probe.returncode == 0


def visible_gpus():
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def run_side(name, command, env, timeout):
    """Runs one side, whose rank 0 writes JSON lines to the path given as its last argument; echoes its
    output and returns (rows, ok)."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        path = f.name
    try:
        command = command + ["--jsonl", path]
        print(f"== {name}\n$ " + " ".join(shlex.quote(a) for a in command), flush=True)
        try:
            proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout)
            output, ok = proc.stdout, proc.returncode == 0
            if not ok:
                output += f"\n{name} exited with code {proc.returncode}"
        except subprocess.TimeoutExpired as e:
            # What it printed before the limit (bytes, whatever text= says).
            captured = e.stdout or b""
            output = captured.decode(errors="replace") if isinstance(captured, bytes) else captured
            output += f"\n{name} timed out after {timeout} s"
            ok = False
        print(output.rstrip(), flush=True)
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return rows, ok
    finally:
        os.unlink(path)


def fmt(value, spec):
    return format(value, spec) if value is not None else "-"


def driver(args):
    env = dict(os.environ)
    for key, value in SAFE_ENV.items():
        env.setdefault(key, value)
    nproc = args.nproc or visible_gpus()
    if nproc < 2:
        print(f"collectives.py: needs 2 or more GPUs (found {nproc}; --nproc N to say how many)", file=sys.stderr)
        return 2
    colossal, bench = find_build(args.build)
    status = 0
    ours, theirs = [], []
    if colossal:
        ours, ok = run_side("colossal", [colossal, "run", "--nproc_per_node", str(nproc), "--backend", "processes",
                                         "--", bench] + shared_flags(args), env, args.timeout)
        status |= 0 if ok else 1
    else:
        print(f"collectives.py: no build with colossal and bench/comm/comm_bench in {args.build or BUILD_DIRS}; "
              "build them: cmake --build <dir> --target colossal comm_bench", file=sys.stderr)
        status = 1
    if torch_available():
        theirs, ok = run_side("torch.distributed", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    "--nproc_per_node", str(nproc), os.path.abspath(__file__),
                                                    "--worker"] + shared_flags(args), env, args.timeout)
        status |= 0 if ok else 1
    else:
        print("collectives.py: torch with CUDA is not available here; ours alone", file=sys.stderr)

    key = lambda r: (r["op"], r["dtype"], r["size_mib"])
    ours_by, theirs_by = {key(r): r for r in ours}, {key(r): r for r in theirs}
    print(f"\n== collectives on {nproc} GPUs: time per call (us) and bus bandwidth (GB/s, NCCL's convention); "
          "ratio = our busbw / torch's (above 1: we are faster)")
    print(f"{'op':<15} {'dtype':>5} {'MiB':>5} {'ours us':>10} {'torch us':>10} {'ours busbw':>11} "
          f"{'torch busbw':>12} {'ratio':>7}")
    for op in args.op_list:
        for dtype in args.dtype_list:
            for size_mib in args.sizes:
                a, b = ours_by.get((op, dtype, size_mib)), theirs_by.get((op, dtype, size_mib))
                ratio = a["busbw_gbps"] / b["busbw_gbps"] if a and b and b["busbw_gbps"] > 0 else None
                print(f"{op:<15} {dtype:>5} {size_mib:>5} {fmt(a and a['time_us'], '10.1f'):>10} "
                      f"{fmt(b and b['time_us'], '10.1f'):>10} {fmt(a and a['busbw_gbps'], '11.1f'):>11} "
                      f"{fmt(b and b['busbw_gbps'], '12.1f'):>12} {fmt(ratio, '7.3f'):>7}")
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            for row in ours + theirs:
                f.write(json.dumps(row) + "\n")
    return status


def main():
    args = parse_args()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
