"""What torch_tp.py and torch_pp.py share: the GPT shape options, the rank's GPU, random tokens, the timing
of a step (CUDA events over --steps after --warmup, the slowest rank's), and the MFU of a GPT step counted
as tp_mfu.sh and pipeline_bubble.sh count ours (6N + 12 L C T FLOPs per token, N without wpe, against
989.4 TFLOP/s, each GPU's share)."""
import os

VOCAB, PADDED_VOCAB = 50257, 50304


def add_shape_args(parser, layers, width, heads, batch):
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--width", type=int, default=width)
    parser.add_argument("--heads", type=int, default=heads)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)


def rank_device():
    """(world size, rank, this rank's GPU) under torchrun, the GPU made current."""
    import torch
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    return int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), torch.device("cuda", local)


def random_tokens(args, device):
    """Inputs and targets [batch, seq], the same on every rank."""
    import torch
    g = torch.Generator(device=device).manual_seed(42)
    shape = (args.batch, args.seq)
    return (torch.randint(0, VOCAB, shape, device=device, generator=g),
            torch.randint(0, VOCAB, shape, device=device, generator=g))


def time_step_ms(step, args, device):
    """ms per step over args.steps after args.warmup, the slowest rank's; and step()'s last result."""
    import torch
    import torch.distributed as dist
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        result = step()
    stop.record()
    stop.synchronize()
    t = torch.tensor([start.elapsed_time(stop) / args.steps], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item(), result


def speed(args, ms, world):
    """'ms/step, tokens/s, MFU per GPU' of a GPT step of args' shape over `world` GPUs."""
    L, C, T = args.layers, args.width, args.seq
    n = L * (12 * C * C + 13 * C) + PADDED_VOCAB * C + 2 * C  # without wpe
    flops = (6 * n + 12 * L * C * T) * args.batch * T
    return (f"{ms:.2f} ms/step, {args.batch * T / ms * 1e3:.0f} tokens/s, "
            f"MFU per GPU {flops / world / (ms * 1e-3) / 989.4e12:.1%}")
