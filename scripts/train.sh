#!/usr/bin/env bash
# The project's main job (README.md): installs the dependencies, builds the colossal program in
# build/ (the same configuration scripts/test.sh uses, so the two share one build) and trains with
# it. Without arguments it trains the default config, a small ViT on Fashion-MNIST (on the GPU when
# there is one, else on the CPU), writing metrics to logs/vit_fashion_mnist.jsonl; arguments go to
# `colossal train` instead, e.g. `bash scripts/train.sh --config configs/vit_fashion_mnist.toml
# --set train.epochs=1`, or the built-in MLP job: `bash scripts/train.sh --steps 2000`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

export CCACHE_DIR="${CCACHE_DIR:-${HOME:-/root}/.cache/ccache}"
mkdir -p "$CCACHE_DIR"

# RelWithDebInfo: -O2 with symbols; the kernels in colossal_ops are built with -O3 in any case.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)" --target colossal
build/src/colossal/cli/colossal info
if [[ $# -eq 0 ]]; then
  mkdir -p logs
  set -- --config configs/vit_fashion_mnist.toml --metrics logs/vit_fashion_mnist.jsonl
fi
exec build/src/colossal/cli/colossal train "$@"
