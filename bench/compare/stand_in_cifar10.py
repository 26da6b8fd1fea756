#!/usr/bin/env python3
"""Writes stand-in CIFAR-10 files: the six files of CIFAR-10's binary version (data_batch_1..5.bin,
test_batch.bin; 10,000 records of a label byte 0..9 and 3 x 32 x 32 pixel bytes each) filled with
random bytes from a fixed seed, so that a config reading $DATA runs at full size where the real data
cannot be fetched. Does nothing when the folder already holds test_batch.bin.

    bench/compare/stand_in_cifar10.py FOLDER"""
import os
import random
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    if os.path.exists(os.path.join(folder, "test_batch.bin")):
        return
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(10)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        records = bytearray(rng.randbytes(10000 * 3073))
        for r in range(10000):
            records[r * 3073] %= 10
        # Written under a temporary name and renamed, so an interrupted run leaves no short file.
        path = os.path.join(folder, name)
        with open(path + ".tmp", "wb") as f:
            f.write(records)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
