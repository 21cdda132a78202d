#!/usr/bin/env bash
# RULE_LAUNCH_COMPILE / RULE_LAUNCH_LINK of the fuzz targets (tests/fuzz/CMakeLists.txt): runs the
# build's own command line with clang++ in place of the project's C++ compiler and the fuzzing flags
# added, so a GCC build still gets libFuzzer targets (clang and GCC objects share libstdc++'s ABI).
#   clang_fuzz_launcher.sh <project C++ compiler> <clang++> <flags> <command...>
set -euo pipefail
compiler="$1" clang="$2" flags="$3"
shift 3
args=()
for a in "$@"; do
  if [ "$a" = "$compiler" ]; then args+=("$clang"); else args+=("$a"); fi
done
exec "${args[@]}" $flags
