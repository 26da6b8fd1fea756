#!/usr/bin/env python3
"""Gaps between the compute stream's kernels in core/profiler Chrome traces, and what they wait for.

    bench/compare/stream_gaps.py TRACE.json [TRACE.json ...]

Per trace (10 traced steps assumed, as bench/compare/dp_profile.sh takes): the gaps over 3 us per step,
split into those that end within 4 us of another stream's kernel ending (a wait on that stream) and
the rest (the host, or a launch), the largest by the kernels on either side, and the host ranges
(pid 1) that were open over the 200 largest host-side gaps. The first traced step's start carries
the profiler's own start-up (a gap of 1-5 ms before its first forward kernels): read past it."""
import bisect
import collections
import sys

from profile_trace import Trace


def short(n):
    return n.split("(")[0][:60]


for path in sys.argv[1:]:
    trace = Trace(path)
    comp, nccl, others, host = trace.compute, trace.nccl, trace.others, trace.host
    steps = 10
    ends = sorted(e["ts"] + e["dur"] for e in nccl + others)
    agg = collections.defaultdict(lambda: [0.0, 0])
    kinds = collections.defaultdict(float)
    big = []
    for a, b in zip(comp, comp[1:]):
        g = b["ts"] - (a["ts"] + a["dur"])
        if g <= 3: continue
        # waiting for another stream: some comm/other kernel ended within 4 us before the next kernel began
        i = bisect.bisect_right(ends, b["ts"])
        waited = i > 0 and b["ts"] - ends[i - 1] < 4 and ends[i - 1] > a["ts"] + a["dur"]
        kind = "after another stream" if waited else "host or launch"
        kinds[kind] += g
        key = (kind, short(a["name"]), short(b["name"]))
        agg[key][0] += g; agg[key][1] += 1
        big.append((g, kind, a, b))
    total = sum(kinds.values())
    print(f"\n== {path}: gaps > 3 us: {total/1e3/steps:.3f} ms/step; " + ", ".join(f"{k} {v/1e3/steps:.3f}" for k, v in kinds.items()))
    for (kind, pa, pb), (g, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:18]:
        print(f"  {g/1e3/steps:.3f} ms/step n/step={n/steps:.1f} [{kind}] {pa} -> {pb}")
    # host ranges over the largest host-side gaps
    big.sort(key=lambda t: -t[0])
    hr = collections.defaultdict(float)
    for g, kind, a, b in big[:200]:
        if kind != "host or launch": continue
        s, t = a["ts"] + a["dur"], b["ts"]
        for h in host:
            o = min(t, h["ts"] + h["dur"]) - max(s, h["ts"])
            if o > 0: hr[h["name"][:70]] += o
    print("  host ranges over the 200 largest host-side gaps (ms/step):", ", ".join(f"{k} {v/1e3/steps:.3f}" for k, v in sorted(hr.items(), key=lambda kv: -kv[1])[:10]))
