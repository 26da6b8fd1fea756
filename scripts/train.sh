#!/usr/bin/env bash
# The project's main job (README.md): installs the dependencies, builds the colossal program in
# build/ (the same configuration scripts/test.sh uses, so the two share one build) and trains with
# it. Arguments go to `colossal train`, e.g. `bash scripts/train.sh --steps 2000 --hidden 128`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

export CCACHE_DIR="${CCACHE_DIR:-${HOME:-/root}/.cache/ccache}"
mkdir -p "$CCACHE_DIR"

# RelWithDebInfo: -O2 with symbols; the kernels in colossal_ops are built with -O3 in any case.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)" --target colossal
build/src/colossal/cli/colossal info
exec build/src/colossal/cli/colossal train "$@"
