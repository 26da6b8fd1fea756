#!/usr/bin/env bash
# Installs, with apt-get, everything colossal's build, tests and benchmarks need on Debian 12 or
# Ubuntu 24.04. Idempotent: when every package is already installed it only checks and returns.
# COLOSSAL_INSTALL_MPI=0 leaves out Open MPI (used by the mpi-labelled tests and the MPI backend).
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache pkg-config
  libopenblas-dev     # CPU GEMM
  libfmt-dev          # error messages and formatting
  libgtest-dev libgmock-dev
  libbenchmark-dev    # bench/
  libcli11-dev        # the colossal program's command line
  nlohmann-json3-dev libspdlog-dev zlib1g-dev
  libtomlplusplus-dev # config files
  dataset-fashion-mnist  # the default training data (and the IDX reader's test on real files)
)
if [[ "${COLOSSAL_INSTALL_MPI:-1}" != 0 ]]; then
  packages+=(libopenmpi-dev openmpi-bin)
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$package")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "install-deps: not root and no sudo; install these packages by hand: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
