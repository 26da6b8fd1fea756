"""Reading core/profiler's Chrome traces (`colossal train --profile`): the lanes of CUPTI's kernels
(pid 3, one lane per stream) and the host's ranges (pid 1). Shared by kernel_excess.py and
stream_gaps.py."""
import bisect
import collections
import json


class Trace:
    """compute: the busiest lane without NCCL kernels, in time order; nccl: the kernels of the lanes
    that run NCCL's (its packing copies with them); others: the remaining lanes' kernels; host: the
    host's ranges. Each event is the trace's dict (ts, dur in us; name)."""

    def __init__(self, path):
        events = json.load(open(path))
        events = events["traceEvents"] if isinstance(events, dict) else events
        lanes = collections.defaultdict(list)
        for e in events:
            if e.get("ph") == "X" and e.get("pid") == 3:
                lanes[e["tid"]].append(e)
        nccl_lanes = {l for l, ks in lanes.items() if any("nccl" in k["name"].lower() for k in ks[:50])}
        compute_lane = max((l for l in lanes if l not in nccl_lanes), key=lambda l: sum(k["dur"] for k in lanes[l]))
        by_time = lambda ks: sorted(ks, key=lambda k: k["ts"])
        self.compute = by_time(lanes[compute_lane])
        self.nccl = by_time(k for l in nccl_lanes for k in lanes[l])
        self.others = by_time(k for l in lanes if l != compute_lane and l not in nccl_lanes for k in lanes[l])
        self.host = [e for e in events if e.get("ph") == "X" and e.get("pid") == 1]


class Intervals:
    """The union of events' [ts, ts + dur) spans, for asking whether an event overlaps any of them."""

    def __init__(self, events):
        merged = []
        for s, t in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], t)
            else:
                merged.append([s, t])
        self.starts = [m[0] for m in merged]
        self.ends = [m[1] for m in merged]

    def overlaps(self, e):
        a, b = e["ts"], e["ts"] + e["dur"]
        i = bisect.bisect_left(self.starts, b)  # spans starting before the event ends
        return i > 0 and self.ends[i - 1] > a
