#!/usr/bin/env python3
"""Where a multi-GPU step's compute-stream kernels lose time against one GPU's (issue 17).

    bench/compare/kernel_excess.py ONE_GPU.json RANK0.json [RANK1.json ...]

Reads core/profiler Chrome traces (`colossal train --profile`, e.g. from bench/compare/dp_profile.sh;
CUPTI kernels are pid 3, one lane per stream). The compute stream is the busiest lane without NCCL
kernels. For each rank: its kernels split into those that overlap an NCCL kernel and the rest, each
with its excess over the mean duration of the same-named kernel on one GPU; the compute stream's gaps;
and the kernels with the largest summed excess. Sums are over the traced window (10 steps by
dp_profile.sh)."""
import json, sys, glob, collections, bisect
def load(path):
    ev = json.load(open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    names = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("pid") == 3 and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
    ks = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 3]
    lanes = collections.defaultdict(list)
    for e in ks: lanes[e["tid"]].append(e)
    def is_nccl(lane): return any("nccl" in e["name"].lower() for e in lanes[lane][:50])
    nccl = [e for l in lanes if is_nccl(l) for e in lanes[l]]
    comp_lane = max((l for l in lanes if not is_nccl(l)), key=lambda l: sum(e["dur"] for e in lanes[l]))
    comp = sorted(lanes[comp_lane], key=lambda e: e["ts"])
    other = [e for l in lanes if l != comp_lane and not is_nccl(l) for e in lanes[l]]
    return comp, sorted(nccl, key=lambda e: e["ts"]), other
def overlaps(e, iv):
    a, b = e["ts"], e["ts"] + e["dur"]
    for s, t in iv:
        if s < b and t > a: return True
    return False
one = sys.argv[1]; many = sys.argv[2:]
c1, _, _ = load(one)
span1 = c1[-1]["ts"] + c1[-1]["dur"] - c1[0]["ts"]
by1 = collections.defaultdict(list)
for e in c1: by1[e["name"]].append(e["dur"])
mean1 = {k: sum(v) / len(v) for k, v in by1.items()}
print(f"1 GPU {one}: {len(c1)} kernels, busy {sum(e['dur'] for e in c1)/1e3:.2f} ms over span {span1/1e3:.2f} ms")
for path in many:
    c, n, o = load(path)
    iv = [(e["ts"], e["ts"] + e["dur"]) for e in n]
    span = c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"]
    busy = sum(e["dur"] for e in c)
    ov = [e for e in c if overlaps(e, iv)]
    nov = [e for e in c if not overlaps(e, iv)]
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
        dov = sum(e["dur"] - mean1.get(k, e["dur"]) for e in es if overlaps(e, iv))
        rows.append((d, dov, len(es), len(by1.get(k, [])), k))
    rows.sort(reverse=True)
    for d, dov, cnt, cnt1, k in rows[:14]:
        print(f"  {d/1e3:+.3f} ms (beside nccl {dov/1e3:+.3f}) n={cnt}/{cnt1} {k[:110]}")
