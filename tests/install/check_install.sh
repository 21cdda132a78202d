#!/usr/bin/env bash
# usage: check_install.sh BUILD_DIR CONSUMER_SOURCE_DIR SCRATCH_DIR [EXTRA_FLAGS] [headers-alone]
# EXTRA_FLAGS: compile and link flags the consumer needs too (the sanitizers of a debug-preset build).
# headers-alone: also compile every installed header alone (tests/install/CMakeLists.txt, Note
# [install phase]); without it one translation unit includes them all.
set -euo pipefail
build=$1 consumer=$2 scratch=$3 extra=${4:-} mode=${5:-}
rm -rf "$scratch"
mkdir -p "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" > "$scratch/install.log"
# Every public header of every module (all but detail/) is installed: a module's HEADERS list that
# forgets one (nn/flops.h once) leaves the installed headers that include it unusable.
src=$(cd "$consumer/../../.." && pwd)
missing=0
for module_cmake in "$src"/*/CMakeLists.txt; do
  module=$(basename "$(dirname "$module_cmake")")
  grep -q "zs_add_module(NAME $module\b" "$module_cmake" || continue
  while IFS= read -r header; do
    rel=${header#"$src/$module/"}
    if [ ! -f "$scratch/prefix/include/zeroshard/$module/$rel" ]; then
      echo "check_install: $module/$rel is not installed; add it to HEADERS in $module/CMakeLists.txt" >&2
      missing=1
    fi
  done < <(find "$src/$module" -name '*.h' -not -path '*/detail/*')
done
[ "$missing" = 0 ]
cmake -S "$consumer" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_CXX_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" \
  -DZS_HEADERS_ALONE="$([ "$mode" = headers-alone ] && echo ON || echo OFF)" \
  > "$scratch/configure.log"
# Builds the consumer and the installed headers (consumer/CMakeLists.txt: all in one translation unit,
# or each alone); on a failure the compiler's message is shown, not only the log's name.
if ! cmake --build "$scratch/build" > "$scratch/build.log" 2>&1; then
  grep -B2 -A12 -m5 "error" "$scratch/build.log" >&2 || tail -50 "$scratch/build.log" >&2
  exit 1
fi
out=$("$scratch/build/consumer")
echo "$out"
[ "$out" = "zeroshard consumer: 3 shards of 10 elements, tail 2" ]
