#!/usr/bin/env bash
# The project's test command (README.md, and CI through .ci/run): installs the dependencies, builds
# everything in build/ (RelWithDebInfo, Ninja, ccache) and runs the CPU test labels under CTest.
# Exits non-zero when a build step or a test fails, or when no test was found.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

export CCACHE_DIR="${CCACHE_DIR:-${HOME:-/root}/.cache/ccache}"
mkdir -p "$CCACHE_DIR"
# Cache hits across checkouts in other folders (CI builds a fresh clone elsewhere): paths are made
# relative to the checkout, and the compiler's working folder (in the debug info) is not hashed.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-20G}"
# mpi-labelled tests start ranks with mpirun; Open MPI refuses to run as root unless told it may.
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# OpenMP threads sleep rather than spin between loops: spinning takes the cores from OpenBLAS and
# from the other test programs running beside them (see Note [OpenMP wait policy] in cli/main.cpp).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$jobs"
# unit: CPU tests; mpi: CPU ranks under mpirun. gpu and e2e tests are run elsewhere (tools/gpu-check).
ctest --test-dir build -L '^(unit|mpi)$' --output-on-failure --no-tests=error -j "$jobs" --timeout 300
