#!/usr/bin/env bash
# Crash during save, long mode: 100 SIGKILLs at random points of a checkpoint save (ctest runs 20),
# through tests/checkpoint/crash_harness.py; the previous tag must always load and `latest` must
# never name a partial tag. Results in docs/checkpoints.md ("Crash test").
#
#   benchmarks/checkpoint_crash.sh [BUILD_DIR] [-- harness arguments]
#       BUILD_DIR   a configured build (default build/release); the driver and zeroshard are built first
#   env: TRIALS=100  RANKS=4  SCALE=200 (checkpoint size: 200 is about 35 MB)  WORKDIR=BUILD_DIR
#        JSON=BUILD_DIR/checkpoint_crash.json
#        SAVE_CMD='...'  the command to kill, with {root} and {tag} (default: the forked-writer
#                        driver, checkpoint_save_driver {root} {tag} --ranks RANKS --scale SCALE)
#        TRAIN_TRIALS=30 then kills of a real `mpirun -np 2 zeroshard train --save` at random moments,
#                        each resumed with --load and checked to end bitwise where an uninterrupted
#                        run ends (crash_harness.py --train kill; ctest runs 3); 0 skips them
#        TRAIN_JSON=BUILD_DIR/checkpoint_crash_train.json
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build/release}"
shift || true
[[ "${1:-}" == "--" ]] && shift
cd "$root"
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  echo "checkpoint_crash.sh: '$build' is not a configured build; run cmake --preset release" >&2
  exit 1
fi
cmake --build "$build" --target checkpoint_save_driver zeroshard
driver="$build/tests/checkpoint/checkpoint_save_driver"
default_cmd="$driver {root} {tag} --ranks ${RANKS:-4} --scale ${SCALE:-200}"
read -r -a save_cmd <<< "${SAVE_CMD:-$default_cmd}"
python3 tests/checkpoint/crash_harness.py --zeroshard "$build/tools/zeroshard" --workdir "${WORKDIR:-$build}" \
  --trials "${TRIALS:-100}" --json "${JSON:-$build/checkpoint_crash.json}" "$@" -- "${save_cmd[@]}"
if [[ "${TRAIN_TRIALS:-30}" != 0 ]]; then
  python3 tests/checkpoint/crash_harness.py --zeroshard "$build/tools/zeroshard" --workdir "${WORKDIR:-$build}" \
    --train kill --trials "${TRAIN_TRIALS:-30}" --seed 2 --steps 24 --save-interval 3 \
    --json "${TRAIN_JSON:-$build/checkpoint_crash_train.json}"
fi
