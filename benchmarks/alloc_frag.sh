#!/usr/bin/env bash
# Records allocation traces of real runs of the built-in GPT, replays them into our lifetime pools,
# the PyTorch caching-allocator model (plain and expandable segments) and one best-fit pool
# (benchmarks/alloc_frag_bench.cpp), draws docs/img/alloc_frag.png and writes the table in
# docs/memory.md ("Fragmentation on real traces", between its BEGIN/END markers).
#
#   benchmarks/alloc_frag.sh [BUILD_DIR]
#       BUILD_DIR   a configured build (default build/release); zeroshard and the benchmark are built there
#   env: OUT_DIR=BUILD_DIR/alloc_frag (traces in OUT_DIR/traces, never in the repository)
#        PNG=docs/img/alloc_frag.png  DOC=docs/memory.md  NP=2 (ranks of the small runs)
#        REPLOT=1   reuse OUT_DIR/alloc_frag.json: draw and write the table only
#
# Traces (device.alloc_trace: rank 0's arena): examples/configs/gpt_zero3.json's GPT at ZeRO stages
# 0-3, with optimizer offload to cpu and nvme, with parameter offload (stage 3) to cpu and nvme, and
# with sequence lengths varying per step (data.min_seq_len, stage 3), and with every block's
# activations recomputed (activation_checkpointing, stage 3; kept inputs on the device, and on the
# host with cpu_checkpointing), 3 steps each at NP ranks;
# examples/configs/gpt_moe.json's GPT-MoE at its 4 ranks; and examples/configs/gpt_2b_nvme.json
# through `zeroshard estimate`, whose measured run is the engine's own allocation sequence without
# the arithmetic (a real 2B run takes minutes and 30 GB of disk).
# Needs Debian's python3 with python3-matplotlib (Debian's; installed with apt-get when missing), mpirun.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build/release}"
cd "$root"
out_dir="${OUT_DIR:-$build/alloc_frag}"
trace_dir="$out_dir/traces"
png="${PNG:-docs/img/alloc_frag.png}"
doc="${DOC:-docs/memory.md}"
np="${NP:-2}"
# Debian's python, where python3-matplotlib installs (a python3 earlier on PATH may be another one).
py="${PYTHON:-/usr/bin/python3}"

if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  echo "alloc_frag.sh: '$build' is not a configured build; run" >&2
  echo "  cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release" >&2
  exit 1
fi
if ! "$py" -c 'import matplotlib' >/dev/null 2>&1; then
  echo "alloc_frag.sh: matplotlib not found; installing Debian's python3-matplotlib" >&2
  sudo_cmd=()
  [[ "$(id -u)" != 0 ]] && sudo_cmd=(sudo)
  # python3-pythran- : without it apt's resolver, weighing matplotlib's dependencies, reaches pythran,
  # whose libboost-dev conflicts with the build's libboost1.81-dev, and gives up; none of it is needed.
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y --no-install-recommends python3-matplotlib python3-pythran-
fi

if [[ "${REPLOT:-0}" != 1 ]]; then
  cmake --build "$build" --target zeroshard alloc_frag_bench
  rm -rf "$trace_dir" "$out_dir/configs" "$out_dir/nvme"
  mkdir -p "$trace_dir" "$out_dir/configs" "$out_dir/nvme"
  # One config per trace, derived from the examples; prints "name mode ranks" lines (mode: train|estimate).
  python3 - "$root/examples/configs" "$out_dir" "$trace_dir" "$np" > "$out_dir/runs.txt" <<'PY'
import json, os, sys
examples, out, traces, np = sys.argv[1:]
base = json.load(open(os.path.join(examples, "gpt_zero3.json")))
nvme = os.path.join(out, "nvme")
def variant(name, stage, opt=None, param=None, min_seq_len=None, ac=None):
    c = json.loads(json.dumps(base))
    if min_seq_len: c.setdefault("data", {})["min_seq_len"] = min_seq_len
    if ac: c["activation_checkpointing"] = ac
    z = c["zero_optimization"]
    z["stage"] = stage
    if opt: z["offload_optimizer"] = {"device": opt, **({"nvme_path": nvme} if opt == "nvme" else {})}
    if param: z["offload_param"] = {"device": param, **({"nvme_path": nvme} if param == "nvme" else {})}
    c["train_steps"] = 3
    c["steps_per_print"] = 1
    c["device"]["alloc_trace"] = os.path.join(traces, name + ".trace")
    json.dump(c, open(os.path.join(out, "configs", name + ".json"), "w"), indent=1)
    print(name, "train", np)
for s in range(4):
    variant(f"gpt_stage{s}", s)
variant("gpt_stage2_opt_cpu", 2, opt="cpu")
variant("gpt_stage3_opt_nvme", 3, opt="nvme")
variant("gpt_stage3_param_cpu", 3, opt="cpu", param="cpu")
variant("gpt_stage3_param_nvme", 3, opt="nvme", param="nvme")
variant("gpt_stage3_varlen", 3, min_seq_len=16)  # each step's sequences 16..128 tokens long
variant("gpt_stage3_recompute", 3, ac={"checkpoint_blocks": "all"})  # every block re-run in backward
variant("gpt_stage3_recompute_cpu", 3, ac={"checkpoint_blocks": "all", "cpu_checkpointing": True})
moe = json.load(open(os.path.join(examples, "gpt_moe.json")))  # ZeRO-3, 8 experts over ep_size 4 ranks
moe["train_steps"] = 3
moe["steps_per_print"] = 1
moe.setdefault("device", {})["alloc_trace"] = os.path.join(traces, "gpt_moe.trace")
json.dump(moe, open(os.path.join(out, "configs", "gpt_moe.json"), "w"), indent=1)
print("gpt_moe train", moe["model"]["moe"]["ep_size"])
big = json.load(open(os.path.join(examples, "gpt_2b_nvme.json")))
for key in ("offload_optimizer", "offload_param"):
    big["zero_optimization"][key]["nvme_path"] = nvme
big["device"]["alloc_trace"] = os.path.join(traces, "gpt_2b_nvme.trace")
json.dump(big, open(os.path.join(out, "configs", "gpt_2b_nvme.json"), "w"), indent=1)
print("gpt_2b_nvme estimate 1")
PY
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  while read -r -u 3 name mode ranks; do
    echo "== $name ($mode, $ranks ranks) =="
    if [[ "$mode" == train ]]; then
      mpirun --oversubscribe -np "$ranks" "$build/tools/zeroshard" train --config "$out_dir/configs/$name.json" \
        > "$out_dir/$name.log" 2>&1 || { tail -20 "$out_dir/$name.log"; exit 1; }
    else
      "$build/tools/zeroshard" estimate --config "$out_dir/configs/$name.json" --stage 3 > "$out_dir/$name.log" 2>&1 \
        || { tail -20 "$out_dir/$name.log"; exit 1; }
    fi
  done 3< "$out_dir/runs.txt"
  "$build/benchmarks/alloc_frag_bench" --trace-dir "$trace_dir" --json "$out_dir/alloc_frag.json"
fi

mkdir -p "$(dirname "$png")"
"$py" - "$out_dir/alloc_frag.json" "$png" "$doc" <<'PY'
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
report_path, png, doc = sys.argv[1:]
rows = json.load(open(report_path))["results"]
policies = ["lifetime_pools", "caching", "caching_expandable", "best_fit"]
traces = list(dict.fromkeys(r["trace"] for r in rows))
at = {(r["trace"], r["policy"]): r for r in rows}
fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
width = 0.2
for k, p in enumerate(policies):
    xs = [i + (k - 1.5) * width for i in range(len(traces))]
    axes[0].bar(xs, [at[(t, p)]["peak_reserved_bytes"] / at[(t, p)]["peak_allocated_bytes"] for t in traces], width, label=p)
    axes[1].bar(xs, [at[(t, p)]["min_capacity_bytes"] / at[(t, p)]["peak_allocated_bytes"] for t in traces], width, label=p)
for ax, title in ((axes[0], "peak reserved / peak allocated"), (axes[1], "smallest arena that runs the trace / peak allocated")):
    ax.set_xticks(range(len(traces)))
    ax.set_xticklabels(traces, rotation=35, ha="right", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_ylim(0.95, max(1.1, max(b.get_height() for b in ax.patches) * 1.03))
axes[0].axhline(1.05, color="grey", linestyle="--", linewidth=0.8)
axes[0].legend(fontsize=8)
fig.tight_layout()
fig.savefig(png, dpi=110)
mib = lambda b: f"{b / 2**20:,.1f}"
lines = ["| trace | policy | peak allocated MiB | peak reserved MiB | reserved / allocated | fragmentation | smallest arena MiB |",
         "|---|---|---:|---:|---:|---:|---:|"]
for t in traces:
    for p in policies:
        r = at[(t, p)]
        lines.append(f"| {t} | {p} | {mib(r['peak_allocated_bytes'])} | {mib(r['peak_reserved_bytes'])} | "
                     f"{r['reserved_over_allocated']:.3f} | {r['fragmentation']:.3f} | {mib(r['min_capacity_bytes'])} |")
text = open(doc).read()
begin, end = "<!-- BEGIN alloc_frag table -->", "<!-- END alloc_frag table -->"
if begin not in text or end not in text:
    sys.exit(f"alloc_frag.sh: {doc} lacks the {begin} / {end} markers")
head, rest = text.split(begin, 1)
text = head + begin + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1]
open(doc, "w").write(text)
print(f"wrote {png} and the table in {doc}")
PY
