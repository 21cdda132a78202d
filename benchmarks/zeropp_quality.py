#!/usr/bin/python3
"""Question (issue 37): does ZeRO++ (hpZ, qwZ, qgZ: docs/design.md "ZeRO++") keep the loss of plain
ZeRO-3, and how many bytes does each part take off the data-parallel group?

Runs `zeroshard train` under mpirun (np 4 by default, hosts of --hpz ranks) for every (seed, variant)
and reports each run's final loss and tail loss (mean of the last --tail steps of the summary's
loss_history), their ratio to plain ZeRO-3's run with the same seed, and rank 0's bytes sent by group
(the summary's zeropp.bytes_sent_by_group) and in all (comm.per_rank[0].bytes_sent, every group).
The setting: the built-in GPT, 2 layers, d_model 128, seq 64, micro-batch 4 per rank, ZeRO-3 (every
module gathered for its forward and again for its backward: stage3_max_reuse_distance 0), fp32,
AdamW with WarmupDecayLR peak 1e-3 (warm-up --warmup of --steps), the built-in corpus
(nn/builtin_corpus.txt, frozen), `seed` = the config's seed (the initialisation and the data order).

Variants: zero3 (no ZeRO++ key), hpz (zero_hpz_partition_size --hpz), qwz (+ zero_quantized_weights),
qgz (+ zero_quantized_gradients, with hpZ's host groups), all (the three).

  nice -n 19 python3 benchmarks/zeropp_quality.py --zeroshard build/release/tools/zeroshard \\
      --json zeropp_quality.json [--seeds 1234,7,1] [--steps 200] [--np 4] [--hpz 2]
      [--from-json zeropp_quality.json]   (the table of an earlier run, nothing run)

Losses are deterministic (no timing), so the machine's load does not matter, only the run time.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zs_train import train_summary  # noqa: E402

VARIANTS = [
    ("zero3", {}),
    ("hpz", {"hpz": True}),
    ("qwz", {"zero_quantized_weights": True}),
    ("qgz", {"hpz": True, "zero_quantized_gradients": True}),
    ("all", {"hpz": True, "zero_quantized_weights": True, "zero_quantized_gradients": True}),
]


def config(args, seed, variant):
    # Every module gathered twice per micro-batch, as ZeRO-3's 3 x parameters per step assume: none kept
    # from the forward for the backward (stage3_max_reuse_distance 0), only the LayerNorms persistent.
    zero = {"stage": 3, "stage3_param_persistence_threshold": 1000, "stage3_max_reuse_distance": 0}
    for key, on in variant.items():
        if key == "hpz":
            zero["zero_hpz_partition_size"] = args.hpz
        else:
            zero[key] = on
    return {
        "train_batch_size": args.micro * args.np,
        "train_micro_batch_size_per_gpu": args.micro,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": args.warmup,
                                 "total_num_steps": args.steps}},
        "zero_optimization": zero,
        "model": {"n_layer": 2, "d_model": args.d_model, "n_head": 4, "seq_len": 64},
        "train_steps": args.steps,
        "steps_per_print": args.steps,
        "seed": seed,
    }


def run(args, cfg, tmp, name):
    return train_summary(args.zeroshard, args.np, cfg, tmp, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", default="build/release/tools/zeroshard")
    ap.add_argument("--seeds", default="1234,7,1")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--hpz", type=int, default=2)
    ap.add_argument("--tail", type=int, default=20)
    ap.add_argument("--from-json", help="print the table of an earlier --json output without running anything")
    ap.add_argument("--json", default="zeropp_quality.json")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",") if x]
    if args.from_json:
        with open(args.from_json) as f:
            report(json.load(f)["runs"], seeds, None)
        return
    runs = []
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for label, variant in VARIANTS:
                s = run(args, config(args, seed, variant), tmp, f"r{len(runs)}")
                losses = s["loss_history"]
                by_group = s.get("zeropp", {}).get("bytes_sent_by_group", {})
                runs.append({"seed": seed, "variant": label, "final_loss": losses[-1],
                             "tail_loss": statistics.fmean(losses[-args.tail:]), "losses": losses,
                             "bytes_by_group": by_group, "rank0_bytes_sent": s["comm"]["per_rank"][0]["bytes_sent"]})
                print(f"[{time.time() - start:6.0f} s] seed {seed} {label}: final {losses[-1]:.4f} "
                      f"tail {runs[-1]['tail_loss']:.4f} {by_group}", flush=True)
                with open(args.json, "w") as f:  # written after every run: a cut-short run keeps what it has
                    json.dump({"args": vars(args), "runs": runs}, f)
    table = report(runs, seeds, time.time() - start)
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "runs": runs, "table": table, "seconds": time.time() - start}, f, indent=1)


def report(runs, seeds, seconds):
    """Prints the markdown table; returns its rows. "vs ZeRO-3": each seed's loss over plain ZeRO-3's
    with that seed, minus 1."""
    base = {r["seed"]: r for r in runs if r["variant"] == "zero3"}
    table = []
    for label, _ in VARIANTS:
        sel = [r for r in runs if r["variant"] == label and r["seed"] in base]
        if not sel:
            continue
        final = [r["final_loss"] / base[r["seed"]]["final_loss"] - 1.0 for r in sel]
        tail = [r["tail_loss"] / base[r["seed"]]["tail_loss"] - 1.0 for r in sel]
        groups = {}
        for r in sel:
            for g, b in r["bytes_by_group"].items():
                groups.setdefault(g, []).append(b)
        table.append({"variant": label, "final_mean": statistics.fmean(r["final_loss"] for r in sel),
                      "final_vs_zero3_mean": statistics.fmean(final), "final_vs_zero3_max_abs": max(abs(x) for x in final),
                      "tail_vs_zero3_mean": statistics.fmean(tail), "tail_vs_zero3_max_abs": max(abs(x) for x in tail),
                      "bytes_by_group": {g: statistics.fmean(b) for g, b in groups.items()},
                      "rank0_bytes_sent": statistics.fmean(r["rank0_bytes_sent"] for r in sel),
                      "per_seed_final": {r["seed"]: r["final_loss"] for r in sel}})
    pct = lambda x: f"{100 * x:+.2f}%"
    mib = lambda b: f"{b / 2**20:.1f}"
    print(f"\n| variant | final loss (mean of {len(seeds)} seeds) | final vs ZeRO-3: mean (largest abs) "
          f"| tail vs ZeRO-3: mean (largest abs) | rank 0 MiB sent: all (by group) | per seed ({', '.join(map(str, seeds))}) |")
    print("|---|---:|---|---|---|---|")
    for t in table:
        per = " ".join(f"{t['per_seed_final'][s]:.4f}" for s in seeds if s in t["per_seed_final"])
        groups = mib(t["rank0_bytes_sent"]) + " (" + (", ".join(f"{g} {mib(b)}" for g, b in t["bytes_by_group"].items()) or "dp") + ")"
        print(f"| {t['variant']} | {t['final_mean']:.4f} | {pct(t['final_vs_zero3_mean'])} ({pct(t['final_vs_zero3_max_abs'])}) | "
              f"{pct(t['tail_vs_zero3_mean'])} ({pct(t['tail_vs_zero3_max_abs'])}) | {groups} | {per} |")
    if seconds is not None:
        print(f"\n{seconds:.0f} s")
    return table


if __name__ == "__main__":
    main()
