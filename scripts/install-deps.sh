#!/usr/bin/env bash
# Installs the Debian 12 packages zeroshard needs to build, test and run its demo.
# Idempotent: when every package is present it installs nothing and touches no network.
#   --bench  also the optional benchmark dependencies (python3-torch, ~1 GB, for
#            benchmarks/torch_compare.py and tests/nn/torch_reference.py, GPT-2 and LLaMA against
#            PyTorch, which make test skips with a message without it; libdnnl-dev, oneDNN, and libxsmm-dev, libxsmm, which
#            gemm_bench compares the bf16 kernel with when the build finds them); `make test` never
#            needs them.
#   --fuzz   also clang 14 and its libFuzzer runtime, for the fuzz targets' libFuzzer build (.ci/run's
#            fuzz phase, cmake -DZS_FUZZ=ON; tests/fuzz/CMakeLists.txt); `make test` replays their seeds
#            with the project's compiler instead.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libhdf5-dev
  libboost-json1.81-dev libboost-program-options1.81-dev
  libspdlog-dev libfmt-dev
  libzstd-dev liburing-dev libssl-dev libxxhash-dev
  libsentencepiece-dev sentencepiece
  python3-h5py python3-hdf5plugin python3-xxhash hdf5-tools
  libgtest-dev libgmock-dev libbenchmark-dev
  iproute2  # ip netns and tc: the two-host runs (tests/multihost, label multihost; root only)
)
case "${1:-}" in
  --bench) packages+=(python3-torch libdnnl-dev libxsmm-dev) ;;
  --fuzz) packages+=(clang-14 libclang-rt-14-dev) ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "install-deps: missing packages ${missing[*]} and not root (run as root or install them)" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
