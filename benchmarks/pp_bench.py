#!/usr/bin/python3
"""Questions (issue 35), through `zeroshard train --summary` and `zeroshard estimate` under mpirun:

memory   Does each pipeline stage's peak activation memory match the estimator (`zeroshard estimate
         --pp-stage S`, within 5%), and how does it grow with the micro-batches m under each schedule?
         1F1B holds at most pp micro-batches (stage s: pp - s), all-forward-all-backward all m.
         For pp 2 (np 2) and pp 4 (np 4), m = 4, 8, 16 and every schedule (interleaved with 2 chunks
         per rank): the GPT (--layers blocks, d_model --d-model, 4 heads, seq --seq, byte vocabulary,
         fp32, AdamW, ZeRO-1, micro-batch --micro), 2 steps. Per stage (rank s, dp 1): the summary's
         memory.per_rank[s].activation_peak_bytes and device_peak_bytes against the estimate's
         transient.activations_peak and device_peak; the estimate's micro_batches_in_flight; and each
         schedule's activation peak over all-forward-all-backward's for the same stage and m.
         Deterministic (no timing): the load does not change these figures.

step     Step time at np 4 of pp 2 x dp 2 against dp 4 and tp 2 x dp 2 on the same global batch
         (--global sequences, micro-batch --step-micro per rank; accumulation makes up the rest), the
         GPT of --step-layers blocks and d_model --step-d-model, ZeRO-1, fp32, one compute thread per
         rank. --rounds rounds, each running the three configs in turn (interleaved, so load drifts hit
         all alike); per run the summary's step_time_s.median over --steps steps; the figure is the
         median over rounds of each round's ratio to dp 4's. Beside it the CPU seconds per step of
         all ranks (the children's user + system time of a --steps run less a 1-step run's): on a
         machine whose other tenants take most of the cores, wall times say how much of the CPU the
         scheduler gave, the CPU seconds what the step cost (spinning waits for peers included). Beside it each layout's memory per rank
         (model states and device peak, the largest rank). With --np2 also pp 2, tp 2 against dp 2 at
         np 2, where each rank has a core of its own on a 2-core machine (at np 4 two ranks share each
         core: a stage's bubble is then filled by the other rank on its core, which a machine with a
         core per rank would not do, so the np 4 ratios say what this machine does, not what pp costs
         with dedicated cores).

  nice -n 19 python3 benchmarks/pp_bench.py --zeroshard build/release/tools/zeroshard --json pp_bench.json
      [--part memory|step|all] [--layers 8] [--d-model 64] [--seq 32] [--micro 2] [--ms 4,8,16] [--pps 2,4]
      [--step-layers 8] [--step-d-model 128] [--step-seq 128] [--global 16] [--step-micro 2]
      [--steps 6] [--rounds 3] [--np2]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

SCHEDULES = [("afab", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)]


def gpt(layers, d, seq, **extra):
    m = {"n_layer": layers, "d_model": d, "n_head": 4, "seq_len": seq}
    m.update(extra)
    return m


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"pp_bench: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def cpu_seconds():
    """User + system CPU seconds of the finished children (mpirun and the ranks it waited for)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def train(args, cfg, np_, tmp, name, steps):
    cpath, spath = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".summary.json")
    json.dump(cfg, open(cpath, "w"))
    cpu0 = cpu_seconds()
    run(["mpirun", "--oversubscribe", "-np", str(np_), args.zeroshard, "train", "--config", cpath, "--steps",
         str(steps), "--summary", spath])
    summary = json.load(open(spath))
    summary["cpu_seconds"] = cpu_seconds() - cpu0  # the whole job, start-up included
    return summary, cpath


def memory_part(args, tmp):
    rows, worst = [], 0.0
    print(f"{'pp':>3} {'m':>3} {'schedule':<12} {'stage':>5} {'in flight':>9} {'act MiB':>9} {'estimate':>9} "
          f"{'dev %':>6} {'act/afab':>8} {'device peak MiB':>15} {'estimate':>9}")
    for pp in args.pps:
        for m in args.ms:
            afab = {}
            for sched, v in SCHEDULES:
                if sched == "interleaved" and (m % pp != 0 or pp * v > args.layers):
                    continue
                cfg = {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": m,
                       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                       "zero_optimization": {"stage": 1}, "seed": 1,
                       "model": gpt(args.layers, args.d_model, args.seq, pipeline_parallel_size=pp,
                                    virtual_pipeline_size=v),
                       "pipeline": {"schedule": sched}}
                name = f"mem_pp{pp}_m{m}_{sched}"
                summary, cpath = train(args, cfg, pp, tmp, name, 2)
                for s in range(pp):
                    est = json.loads(run([args.zeroshard, "estimate", "--config", cpath, "--ranks", str(pp), "--stage",
                                          "1", "--pp-stage", str(s), "--json"]))
                    st = est["stages"][0]
                    act_est = st["transient"]["activations_peak"]["bytes"]
                    peak_est = st["per_shard_size"][0]["device_peak"]["bytes"]
                    in_flight = est["pipeline"]["micro_batches_in_flight"]
                    got = summary["memory"]["per_rank"][s]
                    act, peak = got["activation_peak_bytes"], got["device_peak_bytes"]
                    dev = 100.0 * (act - act_est) / act_est
                    worst = max(worst, abs(dev))
                    if sched == "afab":
                        afab[s] = act
                    over_afab = act / afab[s]
                    rows.append({"pp": pp, "m": m, "schedule": sched, "chunks": v, "stage": s,
                                 "micro_batches_in_flight": in_flight, "activation_peak_bytes": act,
                                 "estimate_activation_peak_bytes": act_est, "deviation_pct": dev,
                                 "activation_over_afab": over_afab, "device_peak_bytes": peak,
                                 "estimate_device_peak_bytes": peak_est})
                    print(f"{pp:>3} {m:>3} {sched:<12} {s:>5} {in_flight:>9} {act / 2**20:>9.3f} {act_est / 2**20:>9.3f} "
                          f"{dev:>6.2f} {over_afab:>8.3f} {peak / 2**20:>15.3f} {peak_est / 2**20:>9.3f}", flush=True)
    return {"results": rows, "max_abs_activation_deviation_pct": worst}


def step_part(args, tmp):
    def layout(name, np_, tp, pp):
        dp = np_ // (tp * pp)
        accum = args.global_batch // (args.step_micro * dp)
        assert accum * args.step_micro * dp == args.global_batch, "--global must be a multiple of micro x dp"
        model = gpt(args.step_layers, args.step_d_model, args.step_seq, tensor_parallel_size=tp,
                    pipeline_parallel_size=pp)
        cfg = {"train_micro_batch_size_per_gpu": args.step_micro, "gradient_accumulation_steps": accum,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1},
               "seed": 1, "model": model, "steps_per_print": 1000}
        if pp > 1:
            cfg["pipeline"] = {"schedule": "1f1b"}
        return name, np_, cfg

    groups = [[layout("dp 4", 4, 1, 1), layout("tp 2 x dp 2", 4, 2, 1), layout("pp 2 x dp 2", 4, 1, 2)]]
    if args.np2:
        groups.append([layout("dp 2", 2, 1, 1), layout("tp 2", 2, 2, 1), layout("pp 2", 2, 1, 2)])
    out = []
    for layouts in groups:
        times = {n: [] for n, _, _ in layouts}
        cpu = {n: [] for n, _, _ in layouts}
        mem = {}
        loads = []
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for name, np_, cfg in layouts:
                tag = f"step_{name.replace(' ', '')}"
                # CPU seconds per step: a run of --steps steps less one of 1 step (start-up and the first step).
                one, _ = train(args, cfg, np_, tmp, tag, 1)
                s, _ = train(args, cfg, np_, tmp, tag, args.steps)
                cpu[name].append((s["cpu_seconds"] - one["cpu_seconds"]) / (args.steps - 1))
                times[name].append(s["step_time_s"]["median"])
                per_rank = s["memory"]["per_rank"]
                ms = [sum(p["model_states_bytes"].values()) for p in per_rank]
                mem[name] = {"model_states_bytes_max": max(ms), "model_states_bytes_per_rank": ms,
                             "device_peak_bytes_max": max(p["device_peak_bytes"] for p in per_rank),
                             "device_peak_bytes_per_rank": [p["device_peak_bytes"] for p in per_rank],
                             "tokens_per_second": s["tokens_per_second"]}
            print(f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f} s ({cpu[n][-1]:.2f} CPU s)" for n, _, _ in layouts)
                  + f" (load {loads[-1]:.1f})", flush=True)
        base = layouts[0][0]
        res = []
        for name, np_, cfg in layouts:
            ratios = [t / b for t, b in zip(times[name], times[base])]
            cpu_ratios = [t / b for t, b in zip(cpu[name], cpu[base])]
            res.append({"layout": name, "np": np_, "step_s_median": statistics.median(times[name]),
                        "cpu_s_per_step_median": statistics.median(cpu[name]), "cpu_s_per_step_rounds": cpu[name],
                        "cpu_ratio_to_" + base.replace(" ", ""): statistics.median(cpu_ratios),
                        "step_s_rounds": times[name], "ratio_to_" + base.replace(" ", ""): statistics.median(ratios),
                        "ratio_rounds": ratios, **mem[name]})
            print(f"{name:<12} np {np_}: step {statistics.median(times[name]):.3f} s, x{statistics.median(ratios):.3f} "
                  f"of {base} (rounds {', '.join(f'{x:.3f}' for x in ratios)}); CPU {statistics.median(cpu[name]):.2f} s "
                  f"per step, x{statistics.median(cpu_ratios):.3f}; model states "
                  f"{mem[name]['model_states_bytes_max'] / 2**20:.2f} MiB, device peak "
                  f"{mem[name]['device_peak_bytes_max'] / 2**20:.2f} MiB per rank (largest); per rank: states "
                  f"{' '.join(f'{b / 2**20:.2f}' for b in mem[name]['model_states_bytes_per_rank'])}, peak "
                  f"{' '.join(f'{b / 2**20:.2f}' for b in mem[name]['device_peak_bytes_per_rank'])} MiB", flush=True)
        out.append({"baseline": base, "layouts": res, "load_1min": loads})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", default="build/release/tools/zeroshard")
    ap.add_argument("--json")
    ap.add_argument("--part", default="all", choices=["memory", "step", "all"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--ms", default="4,8,16")
    ap.add_argument("--pps", default="2,4")
    ap.add_argument("--step-layers", type=int, default=8)
    ap.add_argument("--step-d-model", type=int, default=128)
    ap.add_argument("--step-seq", type=int, default=128)
    ap.add_argument("--global", dest="global_batch", type=int, default=16)
    ap.add_argument("--step-micro", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--np2", action="store_true")
    args = ap.parse_args()
    args.ms = [int(x) for x in args.ms.split(",")]
    args.pps = [int(x) for x in args.pps.split(",")]
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    report = {"benchmark": "pp_bench", "config": {k: v for k, v in vars(args).items() if k not in ("json", "zeroshard")}}
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("memory", "all"):
            report["memory"] = memory_part(args, tmp)
            print(f"largest activation deviation from the estimate: {report['memory']['max_abs_activation_deviation_pct']:.3f}%")
        if args.part in ("step", "all"):
            report["step"] = step_part(args, tmp)
    if args.json:
        json.dump(report, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
