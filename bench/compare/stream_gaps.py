#!/usr/bin/env python3
"""Gaps between the compute stream's kernels in core/profiler Chrome traces, and what they wait for.

    bench/compare/stream_gaps.py TRACE.json [TRACE.json ...]

Per trace (10 traced steps assumed, as bench/compare/dp_profile.sh takes): the gaps over 3 us per step,
split into those that end within 4 us of another stream's kernel ending (a wait on that stream) and
the rest (the host, or a launch), the largest by the kernels on either side, and the host ranges
(pid 1) that were open over the 200 largest host-side gaps. The first traced step's start carries
the profiler's own start-up (a gap of 1-5 ms before its first forward kernels): read past it."""
import json, sys, collections, bisect
def short(n):
    n = n.split("(")[0]
    return n[:60]
def load(path):
    ev = json.load(open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    ks = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 3]
    host = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 1]
    lanes = collections.defaultdict(list)
    for e in ks: lanes[e["tid"]].append(e)
    def is_nccl(l): return any("nccl" in e["name"].lower() for e in lanes[l][:50])
    nccl = sorted((e for l in lanes if is_nccl(l) for e in lanes[l]), key=lambda e: e["ts"])
    comp_lane = max((l for l in lanes if not is_nccl(l)), key=lambda l: sum(e["dur"] for e in lanes[l]))
    comp = sorted(lanes[comp_lane], key=lambda e: e["ts"])
    others = sorted((e for l in lanes if l != comp_lane and not is_nccl(l) for e in lanes[l]), key=lambda e: e["ts"])
    return comp, nccl, others, host
for path in sys.argv[1:]:
    comp, nccl, others, host = load(path)
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
