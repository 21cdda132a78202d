#!/usr/bin/env bash
# Long mode of the fuzz targets (docs/reliability.md): runs one libFuzzer target for N inputs, keeps
# going past a crash or hang (-fork with -ignore_crashes/-ignore_timeouts) so every finding is counted,
# and prints the counts that docs/reliability.md records.
#   tests/fuzz/run_long.sh BUILD_DIR config|checkpoint [INPUTS=10000]
# Environment: FUZZ_TIMEOUT_S (default 30: an input running longer is a hang), FUZZ_MAX_TIME_S (stop early).
# Needs a build configured with -DZS_FUZZ=ON and clang's libFuzzer (scripts/install-deps.sh --fuzz).
set -euo pipefail
build="$1" name="$2" runs="${3:-10000}"
src="$(cd "$(dirname "$0")" && pwd)"
fuzzer="$build/tests/fuzz/${name}_fuzz"
work="$build/tests/fuzz/long-$name"
[ -x "$fuzzer" ] || { echo "run_long: $fuzzer is not built (cmake --preset release -DZS_FUZZ=ON \&\& cmake --build --preset release --target ${name}_fuzz)" >&2; exit 2; }
rm -rf "$work" && mkdir -p "$work/corpus" "$work/artifacts"
seeds=("$src/regressions/$name")
if [ "$name" = config ]; then
  seeds+=("$src/../configs" "$src/../../examples/configs")
else
  "$fuzzer" --write-seeds "$work/seeds" >/dev/null 2>&1
  seeds+=("$work/seeds")
fi
export ASAN_OPTIONS=fast_unwind_on_malloc=0 LSAN_OPTIONS="suppressions=$src/lsan_hdf5.supp:print_suppressions=0"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
start=$(date +%s)
set +e
"$fuzzer" -runs="$runs" ${FUZZ_MAX_TIME_S:+-max_total_time=$FUZZ_MAX_TIME_S} -timeout="${FUZZ_TIMEOUT_S:-30}" -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
  "$work/corpus" "${seeds[@]}" >"$work/log.txt" 2>&1
rc=$?
set -e
units=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$work/log.txt" | tail -1 | grep -o '[0-9]*$' || echo 0)
crashes=$(find "$work/artifacts" -name 'crash-*' -o -name 'leak-*' -o -name 'oom-*' | wc -l)
hangs=$(find "$work/artifacts" -name 'timeout-*' | wc -l)
echo "fuzz $name: $units inputs in $(( $(date +%s) - start )) s; exit $rc; crashes $crashes; hangs $hangs; corpus $(ls "$work/corpus" | wc -l) files"
[ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ] && [ "$hangs" -eq 0 ]
