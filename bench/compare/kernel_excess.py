#!/usr/bin/env python3
"""Where a multi-GPU step's compute-stream kernels lose time against one GPU's (issue 17).

    bench/compare/kernel_excess.py ONE_GPU.json RANK0.json [RANK1.json ...]

Reads core/profiler Chrome traces (`colossal train --profile`, e.g. from bench/compare/dp_profile.sh;
CUPTI kernels are pid 3, one lane per stream). The compute stream is the busiest lane without NCCL
kernels. For each rank: its kernels split into those that overlap an NCCL kernel and the rest, each
with its excess over the mean duration of the same-named kernel on one GPU; the compute stream's gaps;
and the kernels with the largest summed excess. Sums are over the traced window (10 steps by
dp_profile.sh)."""
import collections
import sys

from profile_trace import Intervals, Trace

one = sys.argv[1]; many = sys.argv[2:]
c1 = Trace(one).compute
span1 = c1[-1]["ts"] + c1[-1]["dur"] - c1[0]["ts"]
by1 = collections.defaultdict(list)
for e in c1: by1[e["name"]].append(e["dur"])
mean1 = {k: sum(v) / len(v) for k, v in by1.items()}
print(f"1 GPU {one}: {len(c1)} kernels, busy {sum(e['dur'] for e in c1)/1e3:.2f} ms over span {span1/1e3:.2f} ms")
for path in many:
    trace = Trace(path)
    c, n, o = trace.compute, trace.nccl, trace.others
    iv = Intervals(n)
    span = c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"]
    busy = sum(e["dur"] for e in c)
    ov = [e for e in c if iv.overlaps(e)]
    nov = [e for e in c if not iv.overlaps(e)]
    def excess(es): return sum(e["dur"] - mean1.get(e["name"], e["dur"]) for e in es)
    print(f"\n{path}: {len(c)} kernels, busy {busy/1e3:.2f} ms over span {span/1e3:.2f} ms; nccl kernels {len(n)} busy {sum(e['dur'] for e in n)/1e3:.2f} ms; other streams {sum(e['dur'] for e in o)/1e3:.2f} ms")
    print(f"  beside NCCL: {len(ov)} kernels {sum(e['dur'] for e in ov)/1e3:.2f} ms, excess over the 1-GPU mean {excess(ov)/1e3:+.3f} ms")
    print(f"  alone:       {len(nov)} kernels {sum(e['dur'] for e in nov)/1e3:.2f} ms, excess {excess(nov)/1e3:+.3f} ms")
    gaps = sum(max(0, c[i+1]["ts"] - (c[i]["ts"] + c[i]["dur"])) for i in range(len(c) - 1))
    print(f"  gaps on the compute stream {gaps/1e3:.2f} ms (1 GPU: {(span1 - sum(e['dur'] for e in c1))/1e3:.2f})")
    by = collections.defaultdict(list)
    for e in c: by[e["name"]].append(e)
    rows = []
    for k, es in by.items():
        d = sum(e["dur"] for e in es) - mean1.get(k, 0) * len(es)
        dov = sum(e["dur"] - mean1.get(k, e["dur"]) for e in es if iv.overlaps(e))
        rows.append((d, dov, len(es), len(by1.get(k, [])), k))
    rows.sort(reverse=True)
    for d, dov, cnt, cnt1, k in rows[:14]:
        print(f"  {d/1e3:+.3f} ms (beside nccl {dov/1e3:+.3f}) n={cnt}/{cnt1} {k[:110]}")
