#!/usr/bin/python3
"""Question (issue 38): when does one-bit Adam (and 0/1 Adam) lose quality against Adam on the small
GPTs, and is it the algorithm or zeroshard's compression (256-element scale blocks against DeepSpeed's
one scale per tensor)?

Runs `zeroshard train` under mpirun (np 2 by default) for every (model size, seed, optimizer) and
reports the tail loss (mean of the last --tail steps of the summary's loss_history) of each run, its
ratio to Adam's run with the same size and seed, and per row the mean, min and max of that ratio over
the seeds. The setting is the issue's: 2 layers, seq 64, micro-batch 4 per rank, ZeRO 0, fp32,
WarmupDecayLR peak 1e-3 with --warmup warm-up steps of --steps, betas [0.9, 0.95] for every
optimizer, the built-in corpus (nn/builtin_corpus.txt, frozen), `seed` = the config's seed (the
initialisation and the data order).

Rows per size and seed:
  Adam                           the baseline (torch's Adam, bias-corrected)
  OneBitAdam never frozen        freeze_step > --steps: DeepSpeed's formulas without compression
                                 (no bias correction): what the algorithm costs before compressing
  OneBitAdam block|tensor @F     freeze_step F, compression_scale "block" (zeroshard's) or "tensor"
                                 (DeepSpeed's)
  ZeroOneAdam block|tensor @F    var_freeze_step F, var_update_scaler 16, local_step_scaler 16,
                                 local_step_clipper 2 (benchmarks/optimizer_compare.cpp's settings)

  nice -n 19 python3 benchmarks/onebit_quality.py --zeroshard build/release/tools/zeroshard \\
      --json onebit_quality.json [--sizes 128,256] [--seeds 1234,7,1] [--freezes 40,80] [--np 2]
      [--zero-one-freezes 40] [--zero-one-sizes 128] [--beta2 0.95] [--var-update-scaler 16]
      [--from-json onebit_quality.json]   (the table of an earlier run, nothing run)

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


def config(size, seed, steps, warmup, micro, np_, optimizer):
    heads = 4 if size <= 256 else 8
    return {
        "train_batch_size": micro * np_,
        "train_micro_batch_size_per_gpu": micro,
        "optimizer": optimizer,
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": warmup,
                                 "total_num_steps": steps}},
        "zero_optimization": {"stage": 0},
        "model": {"n_layer": 2, "d_model": size, "n_head": heads, "seq_len": 64},
        "train_steps": steps,
        "steps_per_print": steps,
        "seed": seed,
    }


def rows(args):
    betas = [0.9, args.beta2]
    out = [("Adam", {"type": "Adam", "params": {"lr": 1e-3, "betas": betas}})]
    out.append(("OneBitAdam never frozen",
                {"type": "OneBitAdam", "params": {"lr": 1e-3, "betas": betas, "freeze_step": args.steps + 1}}))
    for f in args.freezes:
        for scale in ("block", "tensor"):
            out.append((f"OneBitAdam {scale} @{f}",
                        {"type": "OneBitAdam", "params": {"lr": 1e-3, "betas": betas, "freeze_step": f,
                                                          "compression_scale": scale}}))
    for f in args.zero_one_freezes:
        for scale in ("block", "tensor"):
            out.append((f"ZeroOneAdam {scale} @{f}",
                        {"type": "ZeroOneAdam", "params": {"lr": 1e-3, "betas": betas, "var_freeze_step": f,
                                                           "var_update_scaler": args.var_update_scaler, "local_step_scaler": 16,
                                                           "local_step_clipper": 2,
                                                           "compression_scale": scale}}))
    return out


def run(args, cfg, tmp, name):
    return train_summary(args.zeroshard, args.np, cfg, tmp, name)["loss_history"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", default="build/release/tools/zeroshard")
    ap.add_argument("--sizes", default="128,256")
    ap.add_argument("--zero-one-sizes", default="128", help="sizes that get the ZeroOneAdam rows")
    ap.add_argument("--seeds", default="1234,7,1")
    ap.add_argument("--freezes", default="40,80")
    ap.add_argument("--zero-one-freezes", default="40")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--tail", type=int, default=20)
    ap.add_argument("--var-update-scaler", type=int, default=16, help="ZeroOneAdam's var_update_scaler")
    ap.add_argument("--beta2", type=float, default=0.95, help="betas[1] of every optimizer (betas[0] is 0.9)")
    ap.add_argument("--from-json", help="print the table of an earlier --json output without running anything")
    ap.add_argument("--json", default="onebit_quality.json")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",") if x]
    sizes, seeds = ints(args.sizes), ints(args.seeds)
    args.freezes = ints(args.freezes)
    zero_one_freezes = ints(args.zero_one_freezes)
    zero_one_sizes = ints(args.zero_one_sizes)

    if args.from_json:
        with open(args.from_json) as f:
            report(json.load(f)["runs"], sizes, seeds, None)
        return
    runs = []
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            args.zero_one_freezes = zero_one_freezes if size in zero_one_sizes else []
            for seed in seeds:
                for label, opt in rows(args):
                    cfg = config(size, seed, args.steps, args.warmup, args.micro, args.np, opt)
                    losses = run(args, cfg, tmp, f"r{len(runs)}")
                    tail = statistics.fmean(losses[-args.tail:])
                    runs.append({"size": size, "seed": seed, "row": label, "optimizer": opt, "tail_loss": tail,
                                 "final_loss": losses[-1], "losses": losses})
                    print(f"[{time.time() - start:6.0f} s] d{size} seed {seed} {label}: tail {tail:.4f}", flush=True)
                    with open(args.json, "w") as f:  # written after every run: a cut-short run keeps what it has
                        json.dump({"args": vars(args), "runs": runs}, f)

    table = report(runs, sizes, seeds, time.time() - start)
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "runs": runs, "table": table, "seconds": time.time() - start}, f, indent=1)


def report(runs, sizes, seeds, seconds):
    """Prints the markdown table; returns its rows. "vs Adam": each seed's tail loss over Adam's with
    that seed, minus 1; "vs uncompressed": over OneBitAdam never frozen's (the same formulas with exact
    averaging), which isolates what the compression costs from the seed-to-seed spread."""
    def by(label):
        return {(r["size"], r["seed"]): r["tail_loss"] for r in runs if r["row"] == label}
    adam, exact = by("Adam"), by("OneBitAdam never frozen")
    table = []
    for size in sizes:
        labels = list(dict.fromkeys(r["row"] for r in runs if r["size"] == size))
        for label in labels:
            sel = [r for r in runs if r["size"] == size and r["row"] == label]
            ratios = [r["tail_loss"] / adam[(size, r["seed"])] - 1.0 for r in sel if (size, r["seed"]) in adam]
            vs_exact = [r["tail_loss"] / exact[(size, r["seed"])] - 1.0 for r in sel if (size, r["seed"]) in exact]
            table.append({"size": size, "row": label, "tail_mean": statistics.fmean(r["tail_loss"] for r in sel),
                          "tail_stdev": statistics.stdev([r["tail_loss"] for r in sel]) if len(sel) > 1 else 0.0,
                          "vs_adam_mean": statistics.fmean(ratios) if ratios else None,
                          "vs_adam_min": min(ratios, default=None), "vs_adam_max": max(ratios, default=None),
                          "vs_uncompressed_mean": statistics.fmean(vs_exact) if vs_exact else None,
                          "vs_uncompressed_min": min(vs_exact, default=None),
                          "vs_uncompressed_max": max(vs_exact, default=None),
                          "per_seed": {r["seed"]: r["tail_loss"] for r in sel}})
    pct = lambda x: "" if x is None else f"{100 * x:+.1f}%"
    print(f"\n| d_model | optimizer | tail loss mean (stdev) | vs Adam: mean (min .. max) | vs uncompressed: mean (min .. max) "
          f"| per seed ({', '.join(map(str, seeds))}) |")
    print("|---:|---|---:|---|---|---|")
    for t in table:
        per = " ".join(f"{t['per_seed'][s]:.4f}" for s in seeds if s in t["per_seed"])
        print(f"| {t['size']} | {t['row']} | {t['tail_mean']:.4f} ({t['tail_stdev']:.4f}) | "
              f"{pct(t['vs_adam_mean'])} ({pct(t['vs_adam_min'])} .. {pct(t['vs_adam_max'])}) | "
              f"{pct(t['vs_uncompressed_mean'])} ({pct(t['vs_uncompressed_min'])} .. {pct(t['vs_uncompressed_max'])}) | {per} |")
    if seconds is not None:
        print(f"\n{seconds:.0f} s")
    return table


if __name__ == "__main__":
    main()
