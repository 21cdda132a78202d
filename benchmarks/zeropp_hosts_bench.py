#!/usr/bin/python3
"""Question (issue 37): on two hosts of two ranks joined by a shaped link, what does ZeRO++ (hpZ + qwZ +
qgZ: docs/design.md "ZeRO++") take off ZeRO-3's step time and off the bytes that cross between hosts,
and do the counters give exactly what the implementation should send?

Runs `zeroshard train` through tests/multihost/hosts.sh (two network namespaces, 2 ranks each, every
link's MTU --mtu) for every link setting and both variants, interleaved: for each repetition, every
setting, ZeRO-3 then ZeRO++. Settings (--settings): "10gbit", "1gbit" (tc tbf on each host's link) and
"1gbit+1ms" (the same rate through the delay line, 1 ms one way: tests/multihost/delay_line.cpp).
The model: the built-in GPT, --layers layers of --d-model, seq 64, micro-batch 2 per rank, fp32, ZeRO-3
with every module gathered for its forward and again for its backward and none kept gathered
(stage3_max_reuse_distance 0, stage3_param_persistence_threshold 0: ZeRO-3's 3 collectives of the model
per step), --steps steps. ZeRO++: zero_hpz_partition_size 2 (one host), zero_quantized_weights,
zero_quantized_gradients.

Per run: the summary's median step time, and the bytes each rank sent across hosts per step
(comm.per_rank[r].bytes_sent_per_step.exact_inter_host_mean, mean over ranks), with comm.ops's
per-collective share across hosts (rank 0's, whole run). The expected bytes across hosts per rank and
step (N = 4 ranks, R = 2 per host, O = 2 hosts, Psi parameters; Note [Bytes across hosts] in
comm/config.h, Note [ZeRO++] in engine/detail/zeropp_gather.h):
  ZeRO-3   3 (N-R)/N Psi x 4 bytes exactly (the forward's and the backward's allgatherv, the gradients'
           reduce-scatter: each the shards of the ranks on the other host), + the scalar allreduces
  ZeRO++   forward: the int8 allgatherv of the other host's pieces, (N-R)/N Psi x q bytes;
           backward: hpZ's gathers inside the host, 0; gradients: qgZ's second all-to-all, the host
           partial of 1/(R O) of each bucket to the other host, (O-1)/N Psi x q bytes;
           q = 1 + 4/256 bytes per element (int8 + one fp32 scale per 256-element block), so
           (N-R+O-1)/N Psi q = 0.75 Psi q at 2 x 2, 0.127x ZeRO-3's; each piece rounds its blocks and
           words up (comm::int8_words), under 8 bytes a piece.
Reported: every rank's bytes across hosts per step (the mean; the scalar allreduces and allgathers of
the loss and norms included), the model's collectives' share of rank 0's (comm.ops: allgatherv,
reduce_scatter, alltoallv) against the formula (ZeRO-3: equal; ZeRO++: above it by less than 8 bytes
per piece crossing hosts), and ZeRO++ / ZeRO-3 for bytes and step time per setting. Exits 1 when a
count misses its formula or ZeRO++ sends more than 0.25x ZeRO-3's bytes.

  python3 benchmarks/zeropp_hosts_bench.py --zeroshard build/release/tools/zeroshard \\
      --hosts-sh tests/multihost/hosts.sh --json zeropp_hosts.json [--reps 3] [--steps 12] \\
      [--settings 10gbit,1gbit,1gbit+1ms] [--layers 4] [--d-model 128] [--mtu 9000]

Needs root (network namespaces). The speed figures are the scheduler's share on a shared machine: the
JSON has `uptime` and the kernel's "workqueue lockup" count before and after.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zs_train import train_summary  # noqa: E402

N, R = 4, 2
O = N // R
Q = 1 + 4 / 256  # int8 bytes per element with one fp32 scale per 256-element block


def config(args, zeropp):
    zero = {"stage": 3, "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 0,
            "reduce_bucket_size": 1_000_000}
    if zeropp:
        zero.update(zero_hpz_partition_size=R, zero_quantized_weights=True, zero_quantized_gradients=True)
    return {
        "train_batch_size": 2 * N,
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "model": {"n_layer": args.layers, "d_model": args.d_model, "n_head": 4, "seq_len": 64},
        "train_steps": args.steps,
        "steps_per_print": args.steps,
        "seed": 1234,
    }


def launcher(args, setting):
    rate, _, delay = setting.partition("+")
    cmd = [args.hosts_sh, "--hosts", str(O), "--slots", str(R), "--mtu", str(args.mtu), "--rate", rate]
    if delay:
        cmd += ["--delay", delay]
    return cmd + ["--"]


def lockups():
    out = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return out.count("workqueue lockup")


def measure(summary):
    ranks = summary["comm"]["per_rank"]
    ops = summary["comm"]["ops"]
    steps = summary["steps"]
    return {
        "step_s": summary["step_time_s"]["median"],
        "final_loss": summary["final_loss"],
        "inter_host_per_rank_step": statistics.mean(r["bytes_sent_per_step"]["exact_inter_host_mean"] for r in ranks),
        "ops_inter_host_per_step_rank0": {k: v["bytes_inter_host"] / steps for k, v in ops.items() if v["bytes_inter_host"]},
        # The model's collectives (rank 0's), without the scalars (losses, norms: allreduce, allgather).
        "model_inter_host_per_step_rank0": sum(ops.get(k, {}).get("bytes_inter_host", 0)
                                               for k in ("allgatherv", "reduce_scatter", "alltoallv")) / steps,
        "pieces_across_per_step": (N - R) * (ops.get("allgatherv", {}).get("count", 0) + ops.get("alltoallv", {}).get("count", 0)) / steps,
        "params": summary["params_total"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", default="build/release/tools/zeroshard")
    ap.add_argument("--hosts-sh", default="tests/multihost/hosts.sh")
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--settings", default="10gbit,1gbit,1gbit+1ms")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--mtu", type=int, default=9000)
    args = ap.parse_args()
    settings = args.settings.split(",")
    variants = [("zero3", False), ("zeropp", True)]
    runs = {(s, v): [] for s in settings for v, _ in variants}
    lockups_before = lockups()
    uptimes = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for s in settings:
                for v, on in variants:
                    summary = train_summary(args.zeroshard, N, config(args, on), tmp, f"{v}_{s.replace('+', '_')}_{rep}",
                                            launcher(args, s))
                    m = measure(summary)
                    runs[(s, v)].append(m)
                    print(json.dumps({"rep": rep, "setting": s, "variant": v, **m}), flush=True)
            uptimes.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    psi = runs[(settings[0], "zero3")][0]["params"]
    formula = {"zero3": 3 * (N - R) / N * psi * 4, "zeropp": (N - R + O - 1) / N * psi * Q}
    table = []
    for s in settings:
        row = {"setting": s}
        for v, _ in variants:
            rs = runs[(s, v)]
            inter = rs[0]["inter_host_per_rank_step"]
            model = rs[0]["model_inter_host_per_step_rank0"]
            row[v] = {"step_s_median": statistics.median(r["step_s"] for r in rs),
                      "step_s_runs": [r["step_s"] for r in rs],
                      "inter_host_per_rank_step": inter,
                      "formula": formula[v],
                      "model_collectives_rank0": model,
                      "measured_minus_formula": model - formula[v],
                      "bound": 8 * rs[0]["pieces_across_per_step"] if v == "zeropp" else 0,
                      "ops_inter_host_per_step_rank0": rs[0]["ops_inter_host_per_step_rank0"],
                      "final_loss": rs[0]["final_loss"],
                      "same_bytes_every_run": all(r["inter_host_per_rank_step"] == inter for r in rs)}
            row[v]["pieces_across_per_step"] = rs[0]["pieces_across_per_step"]
        row["bytes_ratio"] = row["zeropp"]["inter_host_per_rank_step"] / row["zero3"]["inter_host_per_rank_step"]
        row["step_ratio"] = row["zeropp"]["step_s_median"] / row["zero3"]["step_s_median"]
        table.append(row)
    out = {"params": psi, "ranks": N, "ranks_per_host": R, "steps": args.steps, "reps": args.reps, "mtu": args.mtu,
           "model": {"n_layer": args.layers, "d_model": args.d_model, "seq_len": 64, "micro_batch": 2},
           "uptime": uptimes, "workqueue_lockups_before_after": [lockups_before, lockups()], "table": table}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"Psi {psi}; bytes across hosts per rank and step: all (mean over ranks) [the model's collectives, rank 0: "
          "formula, difference <= bound]")
    print("link | ZeRO-3 step s | ZeRO++ step s | ZeRO++/ZeRO-3 step | ZeRO-3 bytes [model: formula, diff] | "
          "ZeRO++ bytes [model: formula, diff <= bound] | ZeRO++/ZeRO-3 bytes")
    for row in table:
        z, p = row["zero3"], row["zeropp"]
        print(f"{row['setting']} | {z['step_s_median']:.3f} | {p['step_s_median']:.3f} | {row['step_ratio']:.2f} | "
              f"{z['inter_host_per_rank_step']:.0f} [{z['model_collectives_rank0']:.0f}: {z['formula']:.0f}, {z['measured_minus_formula']:+.0f}] | "
              f"{p['inter_host_per_rank_step']:.0f} [{p['model_collectives_rank0']:.0f}: {p['formula']:.0f}, "
              f"{p['measured_minus_formula']:+.0f} <= {p['bound']:.0f}] | "
              f"{row['bytes_ratio']:.3f}")
    print("load:", " / ".join(u.split("load average:")[-1].strip() for u in uptimes), f"dmesg workqueue lockups before/after {out['workqueue_lockups_before_after']}")
    bad = [row["setting"] for row in table
           if not (0 <= row["zero3"]["measured_minus_formula"] <= row["zero3"]["bound"]
                   and 0 <= row["zeropp"]["measured_minus_formula"] <= row["zeropp"]["bound"]
                   and row["bytes_ratio"] <= 0.25)]
    if bad:
        print("the counters do not match the formulas (or ZeRO++ sends more than 0.25x) for:", ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
