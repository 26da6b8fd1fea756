#!/usr/bin/env python3
"""What a pipeline's bubble would be with only its ops' times and a fixed latency per exchange.

    bench/compare/pipeline_sim.py --pieces 0.23,0.53x24,1.16 --sizes 7,7,7,5 --stages 2 --microbatches 8 \\
        [--forward-share 0.3] [--latency 0,0.05,0.1,0.2]

--pieces: each piece's forward + backward ms of one microbatch, as `colossal train` prints them for
parallel.partition = "measured" (VALUExN repeats a value); --sizes: pieces per part in part order (Note
[Pipeline parts]: part j goes to stage j % p as its chunk j / p), so stages x chunks of them. Each stage
runs parallel/pp/schedule_order.h's order (1F1B, or Megatron's interleaved 1F1B with several chunks); an
op starts when its stage is free and its input has come (the previous part's forward, the next part's
backward) plus --latency ms. Prints the span and idle / busy over the stages: the bubble the report
measures, less what the ops themselves and the closing work add. Session 24 (docs/benchmarks.md): GPT-2
350M at pp=2, v=2 measured 0.100, where this gives 0.051 with free exchanges, 0.072 at 0.2 ms an exchange and
0.104 at 0.5 ms; at v=1 it measured 0.143, where this gives 0.129 free and 0.140 at 0.1 ms."""
import argparse


def order(rank, p, v, m):
    """(kind, chunk, microbatch) of each op of stage `rank`, as interleaved_order."""
    def forward(k):
        return (k // p) % v, (k // (p * v)) * p + k % p

    def backward(k):
        return v - 1 - (k // p) % v, (k // (p * v)) * p + k % p

    total = m * v
    warm = min(p - rank - 1, m) if v == 1 else min((p - rank - 1) * 2 + (v - 1) * p, total)
    ops = [("F",) + forward(k) for k in range(warm)]
    for i in range(total - warm):
        ops += [("F",) + forward(warm + i), ("B",) + backward(i)]
    return ops + [("B",) + backward(i) for i in range(total - warm, total)]


def simulate(p, v, m, fwd, bwd, latency):
    """fwd[j], bwd[j]: part j's ms. Returns the span and idle / busy."""
    done, clock, busy = {}, [0.0] * p, [0.0] * p
    orders, at = [order(r, p, v, m) for r in range(p)], [0] * p
    while any(at[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            if at[r] == len(orders[r]):
                continue
            kind, chunk, mb = orders[r][at[r]]
            j = chunk * p + r
            if kind == "F":
                need = ("F", j - 1, mb) if j > 0 else None
            else:
                need = ("B", j + 1, mb) if j < v * p - 1 else ("F", j, mb)
            if need is not None and need not in done:
                continue
            ready = 0.0 if need is None else done[need] + (latency if need[1] != j else 0.0)
            took = fwd[j] if kind == "F" else bwd[j]
            clock[r] = max(clock[r], ready) + took
            busy[r] += took
            done[(kind, j, mb)] = clock[r]
            at[r] += 1
            moved = True
        if not moved:
            raise SystemExit("the orders deadlock")
    span = max(clock)
    return span, sum(span - b for b in busy) / sum(busy)


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--pieces", required=True)
    a.add_argument("--sizes", required=True)
    a.add_argument("--stages", type=int, default=2)
    a.add_argument("--microbatches", type=int, default=8)
    a.add_argument("--forward-share", type=float, default=0.3, help="forward's share of forward + backward")
    a.add_argument("--latency", default="0,0.05,0.1,0.2")
    args = a.parse_args()
    pieces = []
    for item in args.pieces.split(","):
        value, _, times = item.partition("x")
        pieces += [float(value)] * (int(times) if times else 1)
    sizes = [int(s) for s in args.sizes.split(",")]
    p = args.stages
    if sum(sizes) != len(pieces) or len(sizes) % p:
        raise SystemExit(f"{len(sizes)} parts of {sum(sizes)} pieces: need a multiple of {p} parts covering {len(pieces)}")
    parts, start = [], 0
    for s in sizes:
        parts.append(sum(pieces[start:start + s]))
        start += s
    fwd = [x * args.forward_share for x in parts]
    bwd = [x - f for x, f in zip(parts, fwd)]
    print(f"parts (ms of one microbatch): {', '.join(f'{x:.2f}' for x in parts)}")
    for latency in (float(x) for x in args.latency.split(",")):
        span, bubble = simulate(p, len(sizes) // p, args.microbatches, fwd, bwd, latency)
        print(f"latency {latency:.2f} ms an exchange: span {span:.2f} ms, bubble (idle / busy) {bubble:.3f}")


if __name__ == "__main__":
    main()
