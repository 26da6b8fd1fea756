#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora under fuzz/seeds/<target>/ (committed; rerun after changing
it): small valid inputs of each format, from tests/data and configs/ where those are small enough,
so that the fuzzer starts past the first checks. Standard library only."""
import gzip
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")


def write(target, name, data):
    folder = os.path.join(SEEDS, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, offset, body = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        body += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def idx(code, dims, values):
    fmt = {0x08: "B", 0x09: "b", 0x0B: "h", 0x0C: "i", 0x0D: "f", 0x0E: "d"}[code]
    return bytes([0, 0, code, len(dims)]) + struct.pack(">" + "I" * len(dims), *dims) + struct.pack(
        ">" + fmt * len(values), *values)


def main():
    # config: the shipped configs, and one with overrides after "%%".
    for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        with open(os.path.join(ROOT, "configs", name), "rb") as f:
            write("config", name, f.read())
    write("config", "overrides.toml",
          "[model]\nname = \"mlp\"\n[data]\ndataset = \"synthetic\"\nbatch_size = 8\n[train]\nepochs = 1\n"
          "\n%%\nparallel.data=2\noptimizer.name=adamw\nparallel.tensor.size=4\nparallel.tensor.mode=\"2d\"")
    write("config", "parallel.toml",
          "[parallel]\ndata = 2\npipeline = 2\nnum_microbatches = 4\n[parallel.tensor]\nsize = 8\nmode = \"3d\"\n"
          "[data]\nbatch_size = 16\n")

    # safetensors
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
    write("safetensors", "one_f32.safetensors", safetensors([("w", "F32", [2, 2], f32)]))
    write("safetensors", "dtypes.safetensors", safetensors([
        ("a", "F64", [2], struct.pack("<2d", 1.5, -0.25)), ("b", "F16", [2], b"\x00\x3c\x00\xc0"),
        ("c", "BF16", [1, 2], b"\x80\x3f\x00\x40"), ("d", "I64", [1], struct.pack("<q", -7)),
        ("e", "I32", [3], struct.pack("<3i", 1, 2, 3)), ("f", "U8", [2], b"\x01\xff"),
        ("g", "BOOL", [2], b"\x00\x01"), ("empty", "F32", [0, 3], b"")],
        {"format": "pt", "step": "12"}))
    write("safetensors", "scalar.safetensors", safetensors([("s", "F32", [], struct.pack("<f", 2.0))]))

    # idx (raw, and gzip as read_file decompresses any file starting 1f 8b)
    images = idx(0x08, [2, 2, 3], list(range(12)))
    labels = idx(0x08, [2], [3, 9])
    for name, data in [("images.idx", images), ("labels.idx", labels),
                       ("i8.idx", idx(0x09, [3], [-1, 0, 1])), ("i16.idx", idx(0x0B, [2, 1], [-300, 300])),
                       ("i32.idx", idx(0x0C, [2], [-70000, 70000])), ("f32.idx", idx(0x0D, [2], [0.5, -1.0])),
                       ("f64.idx", idx(0x0E, [1, 1, 1, 1], [3.0]))]:
        write("idx", name, data)
        write("idx", name + ".gz", gzip.compress(data, mtime=0))
        # idx_gzip: the first byte picks MnistDataset (odd) or read_idx (even); the target gzips the rest.
        write("idx_gzip", name, b"\x00" + data)
    write("idx_gzip", "mnist_images.idx", b"\x01" + images)
    write("idx_gzip", "mnist_labels.idx", b"\x01" + labels)

    # cifar10: one and two records
    record = bytes([7]) + bytes(i % 251 for i in range(3072))
    write("cifar10", "one.bin", record)
    write("cifar10", "two.bin", record + bytes([0]) + bytes(3072))

    # token_file: option byte, then the file (flat, or llm.c's 1024-byte header)
    tokens = struct.pack("<12H", *[50256, 464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 50256])
    llmc = struct.pack("<3i", 20240520, 1, 12) + bytes(1024 - 12) + tokens
    for option in (0x00, 0x13, 0x2a, 0x5f, 0x81):
        write("token_file", f"flat_{option:02x}.bin", bytes([option]) + tokens)
        write("token_file", f"llmc_{option:02x}.bin", bytes([option]) + llmc)

    # tokenizer: encoder.json NUL vocab.bpe NUL text, from GPT-2's files cut to the 256 byte tokens and
    # the first merges whose parts and results are kept.
    with open(os.path.join(ROOT, "tests", "data", "gpt2", "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(ROOT, "tests", "data", "gpt2", "vocab.bpe"), encoding="utf-8") as f:
        merges = f.read().split("\n")[1:]
    by_id = sorted(encoder.items(), key=lambda item: item[1])
    kept = dict(by_id[:256])
    kept_merges = []
    for line in merges:
        if len(kept_merges) == 60:
            break
        parts = line.split(" ")
        if len(parts) != 2 or parts[0] not in kept or parts[1] not in kept:
            continue
        result = parts[0] + parts[1]
        if result not in encoder:
            continue
        kept[result] = encoder[result]
        kept_merges.append(line)
    kept["<|endoftext|>"] = encoder["<|endoftext|>"]
    # Ids compacted so the table stays small; the merges refer to tokens, not ids.
    compact = {token: i for i, token in enumerate(sorted(kept, key=lambda t: kept[t]))}
    encoder_text = json.dumps(compact, ensure_ascii=False, separators=(",", ":"))
    vocab_text = "#version: 0.2\n" + "\n".join(kept_merges) + "\n"
    for name, text in [("hello", "Hello world, the quick brown fox.<|endoftext|>It's 2026!\n"),
                       ("bytes", "\u00e9t\u00e9 \u4e2d\u6587 \U0001F600 \t\r\n  x")]:
        write("tokenizer", name, encoder_text.encode() + b"\0" + vocab_text.encode() + b"\0" + text.encode())
    write("tokenizer", "invalid_utf8", encoder_text.encode() + b"\0" + vocab_text.encode() + b"\0\xff\xfe the \xc3")

    # dist_env: NAME=VALUE lines for each launcher
    write("dist_env", "launcher", "COLOSSAL_LAUNCHER=1\nRANK=1\nLOCAL_RANK=1\nWORLD_SIZE=4\nLOCAL_WORLD_SIZE=2\n"
          "MASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\nCOLOSSAL_RENDEZVOUS_TIMEOUT=2.5\n")
    write("dist_env", "torchrun", "RANK=0\nLOCAL_RANK=0\nWORLD_SIZE=2\nLOCAL_WORLD_SIZE=2\nMASTER_ADDR=node0\n"
          "MASTER_PORT=65534\n")
    write("dist_env", "openmpi", "OMPI_COMM_WORLD_RANK=3\nOMPI_COMM_WORLD_SIZE=4\nOMPI_COMM_WORLD_LOCAL_RANK=1\n"
          "OMPI_COMM_WORLD_LOCAL_SIZE=2\nMASTER_PORT=1234\n")
    write("dist_env", "slurm", "SLURM_PROCID=5\nSLURM_NTASKS=8\nSLURM_LOCALID=1\nSLURM_NODEID=2\n"
          "SLURM_STEP_TASKS_PER_NODE=2(x3),2\nSLURM_STEP_NODELIST=gpu-[003-004,007],login1\nSLURM_JOB_ID=123456\n")
    write("dist_env", "slurm_ntasks", "SLURM_PROCID=0\nSLURM_NTASKS=1\nSLURM_LOCALID=0\nSLURM_NTASKS_PER_NODE=1\n"
          "SLURM_JOB_NODELIST=a1\n")
    write("dist_env", "single", "MASTER_ADDR=host\nMASTER_PORT=20000\nCOLOSSAL_RENDEZVOUS_TIMEOUT=300\n")

    # rendezvous: world byte, arrived byte, then hello (24 bytes) and answer header (8 bytes) pairs
    def job_hash(job_id):  # FNV-1a 64, as comm::detail::job_hash
        h = 0xcbf29ce484222325
        for b in job_id.encode():
            h = ((h ^ b) * 0x100000001b3) % 2**64
        return h

    def hello(rank, world, magic=0x434C5353, version=2, job="fuzz"):
        return struct.pack(">4IQ", magic, version, rank, world, job_hash(job))
    answer = struct.pack(">2I", 0x434C5353, 128)
    write("rendezvous", "ok", bytes([3, 0]) + hello(1, 4) + answer + hello(2, 4) + answer + hello(3, 4) + answer)
    write("rendezvous", "stranger", bytes([1, 0]) + hello(1, 2, magic=0x47455420) + struct.pack(">2I", 0x48545450, 1))
    write("rendezvous", "disagree", bytes([7, 2]) + hello(1, 8) + answer + hello(2, 9, version=3) + answer)
    write("rendezvous", "other_job", bytes([3, 0]) + hello(1, 4, job="other") + struct.pack(">3I", 0x434C5353,
                                                                                          0xFFFFFFFF, 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
