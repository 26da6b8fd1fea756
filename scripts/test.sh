#!/usr/bin/env bash
# The project's test command (README.md, and CI through .ci/run): installs the dependencies, builds
# everything in build/ (RelWithDebInfo, Ninja, ccache) and runs the CPU test labels under CTest, then
# the readers' tests under ASan + UBSan in build-asan-readers/ (tools/sanitize; docs/reliability.md).
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

# The readers of user bytes, tensor sizes, the bootstrap and the rendezvous under ASan + UBSan (gcc,
# tools/sanitize): the part of the sanitizer run that CI affords; the whole run (`tools/sanitize`,
# every unit and mpi test) is on demand. docs/reliability.md ("Sanitizers in CI") says what it costs.
sanitized_tests="core_tensor_test data_loading_readers_test data_loading_fuzz_regressions_test nn_safetensors_test
  nn_fuzz_regressions_test text_tokenizer_test text_fuzz_regressions_test config_train_config_test comm_bootstrap_test
  comm_tcp_rendezvous_test comm_fuzz_regressions_test"
if ! CC=gcc CXX=g++ SANITIZE_BUILD=build-asan-readers SANITIZE_JOBS="$jobs" SANITIZE_LABELS='^unit$' \
  SANITIZE_TARGETS="$sanitized_tests" bash tools/sanitize; then
  echo "scripts/test.sh: the sanitized readers failed (tools/sanitize, ASan + UBSan in build-asan-readers/): a" \
    "sanitizer report, a failed test or a failed build, above. Repeat it with SANITIZE_BUILD=build-asan-readers" \
    "SANITIZE_LABELS='^unit$' SANITIZE_TARGETS=\"$(echo $sanitized_tests)\" tools/sanitize" >&2
  exit 1
fi
