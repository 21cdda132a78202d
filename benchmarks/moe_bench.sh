#!/usr/bin/env bash
# Runs the MoE benchmarks (docs/benchmarks.md, "MoE") with JSON output, one file each under OUT_DIR:
#   moe_alltoall_bench   dispatch all-to-all(v) vs raw MPI_Alltoallv, np 2 and 4 (1 and 2 experts per rank)
#   moe_train_bench      GPT-MoE (8 experts, top-2) vs the dense GPT of the same active FLOPs, np 2 and 4,
#                        three seeds on CORPUS
#   moe_memory_bench     GPT-MoE of 8x the parameters at np 4, ep_size 4, ZeRO-3 (with offload, small buckets)
#                        vs the dense GPT at stage 0, fp32 and bf16
#
#   benchmarks/moe_bench.sh CORPUS [BUILD_DIR]
#       CORPUS     a text file to train on (the benchmark ships none), e.g. tinyshakespeare.txt
#       BUILD_DIR  a configured build (default build/release); the three benchmarks are built there first
#   env: OUT_DIR=BUILD_DIR/moe_bench  NPS="2 4"  SEEDS=1,2,3  STEPS=150  REPS=21
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
corpus="${1:?usage: benchmarks/moe_bench.sh CORPUS [BUILD_DIR]}"
build="${2:-build/release}"
corpus="$(cd "$(dirname "$corpus")" && pwd)/$(basename "$corpus")"
cd "$root"
out_dir="${OUT_DIR:-$build/moe_bench}"
nps="${NPS:-2 4}"
mkdir -p "$out_dir"
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  echo "moe_bench.sh: '$build' is not a configured build; run cmake --preset release first" >&2
  exit 1
fi
cmake --build "$build" --target moe_alltoall_bench moe_train_bench moe_memory_bench
mpirun=(mpirun --oversubscribe)
[[ "$(id -u)" == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for np in $nps; do
  for local in 1 2; do
    "${mpirun[@]}" -np "$np" "$build/benchmarks/moe_alltoall_bench" --min-kib 1024 --max-mib 16 --reps "${REPS:-21}" \
      --experts-per-rank "$local" --json "$out_dir/alltoall_np${np}_l${local}.json"
  done
  "${mpirun[@]}" -np "$np" "$build/benchmarks/moe_train_bench" --data "$corpus" --seeds "${SEEDS:-1,2,3}" \
    --steps "${STEPS:-150}" --json "$out_dir/train_np${np}.json"
done
for precision in fp32 bf16; do
  "${mpirun[@]}" -np 4 "$build/benchmarks/moe_memory_bench" --precision "$precision" --json "$out_dir/memory_np4_$precision.json"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "JSON in $out_dir"
