#!/usr/bin/env python3
"""Validates `zeroshard project` against measured runs (docs/scaling.md, "Validation").

For each configuration (a small GPT at one dp x tp x pp layout and ZeRO stage on NP ranks) it runs
`zeroshard train` (the median step time from the summary) and `zeroshard project` for the same layout
(--tp/--pp select it), and prints one JSON object: per configuration the measured and predicted step time,
their ratio, and the run's mean bytes per step over the projected step's (bytes_sent_per_step.exact_mean).

  nice -n 19 python3 benchmarks/project_validate.py --zeroshard build/release/tools/zeroshard [--quick]
  python3 benchmarks/project_validate.py --zeroshard ... --multihost      # also two hosts under tc (root)

--multihost adds two-host runs (tests/multihost/hosts.sh: network namespaces, the link shaped with tc tbf to
100mbit, 1gbit and 10gbit): two hosts of ONE rank (np 2, a core per rank: dp 2 at ZeRO-1 and ZeRO-3, pp 2 with
a stage on each host) and two hosts of 2 ranks (np 4 on the machine's 2 cores: dp 4 at ZeRO-1 and ZeRO-3),
projected with --ranks-per-host R --cores-per-host 1: each namespace host is given one of the 2 cores of its
own (hosts.sh --cpus-per-host 1), so a rank's threads and a host's oversubscription are the ones projected. Each such
row is projected twice (docs/scaling.md, "Validation"):
  - the network model alone (network_model_over_measured): --network BANDWIDTH,LATENCY measured per rate and
    host layout just before (the projection, one process, cannot measure the namespaces' network):
    comm_bench's allgather over the same hosts at 1 KiB to 1 MiB (x4 steps: the runs' gathers and buckets),
    fitted to the model's charge for it: each rank sends B/2 across beside its host's R - 1 others, so
    t(B) = LATENCY + B R / 2 / BANDWIDTH; LATENCY is t(1 KiB), BANDWIDTH from the least-squares slope of
    t(B) - LATENCY over the larger sizes (tc's nominal rate where the load makes the slope <= 0);
  - with the in-step costs (predicted_over_measured): benchmarks/step_comm_probe over the same hosts and link,
    run just before the training with the layout's own compute per collective between its collectives (the
    first projection's compute over its oversubscription and collectives per step), given to the second
    projection as --link-costs (rows[].step_probe: its work, compute stretch and costs by size).
--network gives a fixed BANDWIDTH,LATENCY instead of the fit. --only and --rates select rows.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# A small GPT: enough work per step that the step is not all fixed costs (about 50-200 ms here).
BASE = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 500000},
    "model": {"n_layer": 4, "d_model": 128, "n_head": 4, "seq_len": 64},
}

# (name, np, tp, pp, ZeRO stage)
ONE_HOST = [
    ("np1", 1, 1, 1, 0),
    ("np2_dp2_zero1", 2, 1, 1, 1),
    ("np2_dp2_zero3", 2, 1, 1, 3),
    ("np2_tp2", 2, 2, 1, 1),
    ("np2_pp2", 2, 1, 2, 1),
    ("np4_dp4_zero2", 4, 1, 1, 2),
    ("np4_dp2_tp2", 4, 2, 1, 1),
]
MULTIHOST_RATES = ["100mbit", "1gbit", "10gbit"]
# Two-host layouts: (hosts x ranks per host, np, tp, pp, ZeRO stage). One rank per host has a core per
# rank on this 2-core machine; two per host put 4 ranks on its 2 cores (oversubscribed).
MULTIHOST = [
    ("2hosts_x1_zero1", 1, 2, 1, 1, 1),
    ("2hosts_x1_zero3", 1, 2, 1, 1, 3),
    ("2hosts_x1_pp2", 1, 2, 1, 2, 1),
    ("2hosts_x2_zero1", 2, 4, 1, 1, 1),
    ("2hosts_x2_zero3", 2, 4, 1, 1, 3),
]


def config_for(np, tp, pp, stage, steps):
    cfg = json.loads(json.dumps(BASE))
    cfg["zero_optimization"]["stage"] = stage
    cfg["model"]["tensor_parallel_size"] = tp
    if pp > 1:
        cfg["model"]["pipeline_parallel_size"] = pp
    cfg["train_steps"] = steps
    return cfg


def run(cmd, name):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"{name}: {' '.join(cmd[:3])}... exited {r.returncode}:\n{r.stdout[-3000:]}")
    return r.stdout


def own_cpus(hosts):
    """hosts.sh's flag giving each host its own share of this machine's CPUs (the projection's
    --cores-per-host), so a host's ranks do not run on another host's cores as they could on real hosts."""
    per_host = (os.cpu_count() or 1) // hosts
    return ["--cpus-per-host", str(per_host)] if per_host >= 1 else []


def network_fit(args, tmp, rate, slots):
    """The link between 2 hosts of 2 ranks at `rate` as the model charges it (see the top): a dict with
    the --network text, the fitted latency and bandwidth and comm_bench's measured times per size."""
    if args.network:
        return {"network": args.network}
    bench = os.path.join(os.path.dirname(args.zeroshard), "..", "benchmarks", "comm_bench")
    out = os.path.join(tmp, f"comm_bench_{rate}_x{slots}.json")
    cmd = [os.path.join(ROOT, "tests/multihost/hosts.sh"), *own_cpus(2), "--hosts", "2", "--slots", str(slots), "--rate", rate, "--",
           "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(2 * slots), bench, "--collective", "allgather",
           "--min-kib", "1", "--max-mib", "1", "--reps", "7", "--warmup", "2", "--arena", "0", "--json", out]
    run(cmd, f"comm_bench over 2 hosts at {rate}")
    with open(out) as f:
        r = json.load(f)
    times = sorted((x["bytes"], x["time_s"]) for x in r["results"] if x["collective"] == "allgather")
    latency = times[0][1]
    big = [(b, t - latency) for b, t in times[1:]]
    slope = sum(b * t for b, t in big) / sum(b * b for b, _ in big)  # seconds per byte, through the origin
    # Each rank sends B/2 across (2 hosts), its host's `slots` ranks at once: t - LATENCY = B x slots / 2 / BANDWIDTH.
    # A slope at or below zero (the load hid the bytes' time): tc's nominal rate.
    nominal = float(rate.replace("gbit", "e9").replace("mbit", "e6").replace("kbit", "e3")) / 8
    bandwidth = slots / 2.0 / slope if slope > 0 else nominal
    return {"network": f"{bandwidth:.0f}bps,{latency * 1e6:.1f}us", "latency_s": latency, "bytes_per_s": bandwidth,
            "allgather_s_by_bytes": {str(b): t for b, t in times},
            "fit_over_measured_by_bytes": {str(b): (latency + b * slope) / t for b, t in times}, "slots": slots}


def project(args, tmp, path, name, np, tp, pp, per_host, hosts, link, link_costs=None):
    """`zeroshard project` of the layout (its JSON)."""
    projection = os.path.join(tmp, name + (".probed" if link_costs else "") + ".projection.json")
    proj = [args.zeroshard, "project", "--config", path, "--ranks", str(np), "--ranks-per-host", str(per_host),
            "--tp", str(tp), "--pp", str(pp), "--json", projection]
    if not args.idle:
        proj.append("--as-loaded")  # the runs are measured at the machine's present load
    if hosts:
        # The "hosts" are namespaces of this one machine: they share its cores.
        proj += ["--network", link["network"], "--cores-per-host", str(max(1, (os.cpu_count() or 1) // hosts))]
    if link_costs:
        proj += ["--link-costs", link_costs]
    run(proj, name + " (project)")
    with open(projection) as f:
        p = json.load(f)
    if not p["layouts"][0]["valid"]:
        sys.exit(f"{name}: the projection refused the layout: {p['layouts'][0]['why_not']}")
    return p


def step_probe(args, tmp, name, hosts, per_host, rate, lay, oversubscription):
    """benchmarks/step_comm_probe over the same hosts and link, with the compute the layout's rank runs
    between two collectives that wait on its compute thread (CPU seconds: the projected compute over its
    stretch): ZeRO-3's gathers split the passes, a pipeline's sends each pass; at stages 0-2 the
    gradient buckets run beside the passes and the step's blocking collectives follow them, so the passes
    are one stretch of compute. The length matters: the scheduler preempts a rank in a 3 ms stretch
    where it leaves a 0.3 ms one alone (4 ranks on 2 cores at load 9: compute stretch 2.6 against 1.3, a
    gather's in-step cost 8-9 ms against 1.3 ms). The in-step cost of each collective by size
    (docs/scaling.md, "Validation")."""
    cpu = lay["compute_s"] / max(1.0, oversubscription)
    if lay["zero_stage"] == 3:
        work = cpu / max(1, lay["collectives_per_step"])
    elif lay["pp"] > 1:
        work = cpu / (2 * max(1, lay["micro_batches"]))
    else:
        work = cpu
    work_us = min(50000.0, max(20.0, 1e6 * work))
    out = os.path.join(tmp, name + ".probe.json")
    bench = os.path.join(os.path.dirname(args.zeroshard), "..", "benchmarks", "step_comm_probe")
    cmd = [os.path.join(ROOT, "tests/multihost/hosts.sh"), *own_cpus(hosts), "--hosts", str(hosts), "--slots", str(per_host), "--rate", rate,
           "--", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(hosts * per_host), bench,
           "--work-us", f"{work_us:.0f}", "--rounds", "5", "--json", out]
    run(cmd, name + " (step_comm_probe)")
    with open(out) as f:
        r = json.load(f)
    return {"file": out, "work_us": work_us, "compute_stretch": r["compute_stretch"],
            "seconds_by_collective": {c: {str(x["bytes"]): x["seconds"] for x in rows} for c, rows in r["collectives"].items()}}


def measure(args, tmp, name, np, tp, pp, stage, hosts=None, rate=None, link=None):
    cfg = config_for(np, tp, pp, stage, args.steps)
    path = os.path.join(tmp, name + ".json")
    summary = os.path.join(tmp, name + ".summary.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    train = [args.zeroshard, "train", "--config", path, "--summary", summary]
    if hosts:
        cmd = [os.path.join(ROOT, "tests/multihost/hosts.sh"), *own_cpus(hosts), "--hosts", str(hosts), "--slots", str(np // hosts),
               "--rate", rate, "--", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np)] + train
    else:
        # --bind-to none: the ranks share the host's cores, as the projection assumes (launch's share:
        # cores / ranks threads each); OpenMPI would bind each of 1-2 ranks to one core.
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np)] + train
    per_host = np // hosts if hosts else np
    lay0 = None
    if hosts:
        # First the network's latency-bandwidth model, whose compute per collective sets the probe's work;
        # then the probe of the in-step costs, the runs, and the projection with those costs.
        p0 = project(args, tmp, path, name, np, tp, pp, per_host, hosts, link)
        lay0 = p0["layouts"][0]
        probe = step_probe(args, tmp, name, hosts, per_host, rate, lay0, p0["oversubscription"])
    medians = []
    for _ in range(args.repeats):
        run(cmd, name)
        with open(summary) as f:
            s = json.load(f)
        medians.append(s["step_time_s"]["median"])
    p = project(args, tmp, path, name, np, tp, pp, per_host, hosts, link, probe["file"] if hosts else None)
    lay = p["layouts"][0]
    measured = statistics.median(medians)
    # The run's mean per step over the projected step's bytes: a little above 1, since the first step's
    # window also holds the train command's start-up collectives (tests/e2e/project_agreement.cmake
    # checks one step's bytes exactly).
    bytes_ratio = max(
        s["comm"]["per_rank"][r]["bytes_sent_per_step"]["exact_mean"] / max(1, lay["ranks"][r]["bytes_sent_per_step"])
        for r in range(np))
    return {
        "name": name, "np": np, "tp": tp, "pp": pp, "zero_stage": stage, "hosts": hosts or 1, "rate": rate,
        "load_1min": os.getloadavg()[0], "network": link, "shm_collective_s": p["machine"]["shm_latency_s"],
        "loaded_stretch": p["machine"]["loaded_stretch"],
        "measured_step_s": measured, "measured_runs_s": medians, "predicted_step_s": lay["step_s"],
        "predicted_over_measured": lay["step_s"] / measured if measured > 0 else None,
        "predicted_compute_s": lay["compute_s"], "predicted_dp_exposed_s": lay["dp_exposed_s"],
        "predicted_bubble": lay["bubble"], "collectives_per_step": lay["collectives_per_step"], "measured_mfu": s.get("mfu", {}).get("mfu"), "predicted_mfu": lay["mfu"],
        "bytes_mean_over_projected": bytes_ratio,
        "compute_stretch": p["oversubscription"],
        "predicted_network_model_s": lay0["step_s"] if lay0 else None,
        "network_model_over_measured": lay0["step_s"] / measured if lay0 and measured > 0 else None,
        "step_probe": probe if hosts else None,
    }


def within(rows, key):
    """'k of n': how many of the rows' `key` ratios lie within 15% of 1."""
    return f"{sum(1 for r in rows if r.get(key) and 0.85 <= r[key] <= 1.15)} of {len(rows)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", default=os.path.join(ROOT, "build/release/tools/zeroshard"))
    ap.add_argument("--steps", type=int, default=8, help="training steps per run (the median excludes nothing)")
    ap.add_argument("--quick", action="store_true", help="np 1 and 2 only, 4 steps")
    ap.add_argument("--multihost", action="store_true", help="also two hosts of 2 ranks under tc (needs root)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per configuration; the measured step is the median of their medians")
    ap.add_argument("--idle", action="store_true", help="project an idle host's compute (without --as-loaded)")
    ap.add_argument("--network", default="",
                    help="a fixed BANDWIDTH,LATENCY for the two-host rows (default: measured per rate, see the top)")
    ap.add_argument("--only", default="", help="comma-separated substrings: only configurations whose name has one")
    ap.add_argument("--rates", default=",".join(MULTIHOST_RATES), help="the two-host rows' tc rates (comma-separated)")
    args = ap.parse_args()
    wanted = lambda name: not args.only or any(x in name for x in args.only.split(","))
    if args.quick:
        args.steps = 4
    cases = [c for c in ONE_HOST if (not args.quick or c[1] <= 2) and wanted(c[0])]
    rows = []
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for name, np, tp, pp, stage in cases:
            rows.append(measure(args, tmp, name, np, tp, pp, stage))
            print(f"{name}: measured {rows[-1]['measured_step_s']:.4f} s, predicted {rows[-1]['predicted_step_s']:.4f} s",
                  file=sys.stderr)
        if args.multihost:
            for rate in args.rates.split(","):
                links = {}
                for base, slots, np, tp, pp, stage in MULTIHOST:
                    if not wanted(f"{base}_{rate}"):
                        continue
                    if slots not in links:
                        links[slots] = network_fit(args, tmp, rate, slots)
                    name = f"{base}_{rate}"
                    rows.append(measure(args, tmp, name, np, tp, pp, stage, hosts=2, rate=rate, link=links[slots]))
                    print(f"{name}: measured {rows[-1]['measured_step_s']:.4f} s, predicted "
                          f"{rows[-1]['predicted_step_s']:.4f} s", file=sys.stderr)
    ratios = [r["predicted_over_measured"] for r in rows if r["predicted_over_measured"]]
    out = {
        "load_at_start": load_at_start, "load_at_end": os.getloadavg(),
        "rows": rows,
        "within_15_percent": sum(1 for q in ratios if 0.85 <= q <= 1.15),
        "within_15_percent_one_host": within([r for r in rows if r["hosts"] == 1], "predicted_over_measured"),
        "within_15_percent_two_hosts": within([r for r in rows if r["hosts"] > 1], "predicted_over_measured"),
        "network_model_within_15_percent_two_hosts": within([r for r in rows if r["hosts"] > 1],
                                                            "network_model_over_measured"),
        "configurations": len(rows),
        "bytes_mean_over_projected_max": max(r["bytes_mean_over_projected"] for r in rows),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
