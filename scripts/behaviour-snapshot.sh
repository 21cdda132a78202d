#!/usr/bin/env bash
# A snapshot of what the program computes, for comparing a refactoring's before and after: for each
# training config (examples/configs and tests/configs/train_*.json that need nothing outside the
# repository) at 1 and 2 ranks, a short `zeroshard train` run's final loss, parameter digest and rank 0's
# device peak, and `zeroshard estimate --config` at 2 ranks (every stage). One line per case, sorted, so
# two snapshots compare with diff.
#   scripts/behaviour-snapshot.sh build/release/tools/zeroshard OUT.txt [STEPS]
set -euo pipefail
tool=$(realpath "${1:?usage: behaviour-snapshot.sh ZEROSHARD OUT.txt [STEPS]}")
out=${2:?usage: behaviour-snapshot.sh ZEROSHARD OUT.txt [STEPS]}
steps=${3:-4}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
configs=("$root"/examples/configs/{gpt_tiny,gpt_tiny_bf16_comm,gpt_tiny_fp16,gpt_zero3}.json "$root"/tests/configs/gpt_moe_{ep1,ep2}.json)
for c in "$root"/tests/configs/train_*.json; do
  case "$(basename "$c")" in
    train_alloc_trace.json|train_monitor.json|train_flops_profiler.json) ;;  # write files of their own
    *) configs+=("$c") ;;
  esac
done
: > "$work/lines"
for c in "${configs[@]}"; do
  name=$(basename "$c" .json)
  for np in 1 2; do
    s="$work/$name.np$np.json"
    if (cd "$work" && mpirun --oversubscribe -np "$np" "$tool" train --config "$c" --steps "$steps" --summary "$s" \
          >"$work/log" 2>&1); then
      python3 - "$s" "$name" "$np" >>"$work/lines" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
r0 = s["memory"]["per_rank"][0]
print(f"train {sys.argv[2]} np{sys.argv[3]}: losses {' '.join(f'{x:.6f}' for x in s['loss_history'])} "
      f"digest {s['param_digest'][:16]} device_peak {r0['device_peak_bytes']} states {r0['model_states_bytes']}")
PY
    else
      echo "train $name np$np: failed: $(grep -m1 -i error "$work/log" || tail -1 "$work/log")" >>"$work/lines"
    fi
  done
  if "$tool" estimate --config "$c" --ranks 2 --json >"$work/est.json" 2>"$work/log"; then
    echo "estimate $name: $(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])), sort_keys=True))' "$work/est.json")" >>"$work/lines"
  else
    echo "estimate $name: failed: $(grep -m1 -i error "$work/log" || tail -1 "$work/log")" >>"$work/lines"
  fi
done
sort "$work/lines" >"$out"
echo "behaviour-snapshot: $(wc -l <"$out") cases in $out" >&2
