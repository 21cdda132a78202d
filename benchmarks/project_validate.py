#!/usr/bin/env python3
"""Validates `zeroshard project` against measured runs (docs/scaling.md, "Validation").

For each configuration (a small GPT at one dp x tp x pp layout and ZeRO stage on NP ranks; its MoE variant at
ep 2, and ZeRO++ on two hosts of 2) it runs
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
    projection as --link-costs (rows[].step_probe: its work, compute stretch and costs by size); --probe-jobs K
    (default 2) runs it K times and takes each call's least (rows[].step_probe.seconds_by_collective_by_job: each).
    Its --network is tc's rate (the link's line rate), the fit's latency and tbf's bucket (rows[].probed_network),
    against which the model bounds the step's bytes (Note [the link's bucket] in project/project_compute.cpp),
    the rate and bucket over the wire's bytes per counted byte across hosts: the links' tx counters (hosts.sh
    --stats) over the ranks' counted bytes across hosts in the row's first run, both less those of a 2-step run
    made before it (START_UP_STEPS), so that the bytes no step sends drop out (rows[].wire_over_counted_bytes:
    TCP/IP headers, OpenMPI's messages and its algorithms' own crossings; at 100 Mbit/s on hosts of 2, 1.005 at
    ZeRO-1, 1.127 at ZeRO-3 and 1.107 for ZeRO++; rows[].wire_over_counted_bytes_whole_run keeps the whole run's,
    which holds the start-up's and the summary's bytes too). That is the one figure taken from the run compared;
    line_rate_over_measured is the projection without it (tc's rate for the counted bytes).
--reproject FILE projects a saved run's rows again (its measurements and kept probes; nothing trained or
probed): a model change checked against recorded runs, the saved compute kept so only the model moves.
--network gives a fixed BANDWIDTH,LATENCY instead of the fit. --only and --rates select rows. --burst BYTES
sets tbf's bucket of every two-host run (hosts.sh --burst; the JSON's tbf_burst_bytes).

--repeats K runs K rounds, each training and projecting every configuration once (round 1 also fits and
probes it; even rounds go in reverse order), so that a configuration's runs are minutes apart and a burst
of load shows as its spread: rows[].measured_step_s is the median of its runs' medians, measured_min_s /
measured_max_s / measured_spread ((most - least) / median, the least and most left out from 5 rounds on:
middle_spread) beside it, predicted_over_measured_range the ratio against the most and the least. The
projection, which measures this machine's compute, is taken after each round's run too
(rows[].predicted_runs_s; predicted_step_s is their median). From round 2 on a configuration trains for
about --run-seconds (3 s; rows[].steps_per_run), not --steps, so that one slow spell of the machine does
not move a run's median step. A row whose spread exceeds QUIET_SPREAD (5%,
a third of the target) is named in noisy_rows: its verdict is the machine's, not the model's;
within_15_percent_of_quiet_rows counts the others. A Markdown table of the rows goes to stderr.
"""
import argparse
import json
import math
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
    ("np2_moe_ep2", 2, 1, 1, 1),
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
    ("2hosts_x1_moe_ep2", 1, 2, 1, 1, 1),
    ("2hosts_x2_zeropp", 2, 4, 1, 1, 3),
]
# A configuration whose name has "moe_ep2" trains the GPT-MoE variant of BASE (MOE, expert-parallel degree 2);
# "zeropp" turns ZeRO++ on (hpZ over a host's ranks, quantised weights and gradients).
MOE = {"num_experts": 4, "k": 2, "capacity_factor": 1.25, "every_n_layers": 2}


def config_for(np, tp, pp, stage, steps, name="", per_host=0):
    cfg = json.loads(json.dumps(BASE))
    cfg["zero_optimization"]["stage"] = stage
    cfg["model"]["tensor_parallel_size"] = tp
    if pp > 1:
        cfg["model"]["pipeline_parallel_size"] = pp
    if "moe_ep2" in name:
        cfg["model"]["moe"] = dict(MOE, ep_size=2)
    if "zeropp" in name:
        cfg["zero_optimization"].update(zero_hpz_partition_size=per_host or np, zero_quantized_weights=True,
                                        zero_quantized_gradients=True)
    cfg["train_steps"] = steps
    return cfg


def expert_parallel(name):
    """The layout's expert-parallel degree (an MoE configuration's), for `zeroshard project --ep`."""
    return 2 if "moe_ep2" in name else 1


def comm_dtype(cfg):
    """The dtype the config's gradients and parameters travel in (`communication_data_type`, by default the
    compute dtype): the probe's, since it decides the path (step_comm_probe: MPI's own fp32 reduce-scatter
    took 3x comm's bf16 one for the same bytes across)."""
    given = cfg.get("communication_data_type")
    if given:
        return given.lower()
    return "bf16" if cfg.get("bf16", {}).get("enabled") else "fp32"


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


def shaping(args, rate):
    """hosts.sh's flags shaping the link: tc's rate, and --burst's tbf bucket where given (by default hosts.sh's
    10 ms of the rate, which a real NIC has not: docs/scaling.md, "What the link's burst hides")."""
    return ["--rate", rate] + (["--burst", str(args.burst)] if args.burst else [])


def tbf_bucket(args, rate):
    """The bytes tbf lets a host send above `rate` after a pause: --burst, else hosts.sh's default (10 ms of
    the rate, at least 64 KiB)."""
    if args.burst:
        return args.burst
    return max(65536, int(rate_bits(rate) // 800))


def rate_bits(rate):
    """tc's rate ("100mbit") in bits per second."""
    return float(rate.replace("gbit", "e9").replace("mbit", "e6").replace("kbit", "e3"))


def probed_network(args, rate, link, wire_overhead=1.0):
    """--network for the projection with the probe's in-step costs: tc's rate (the link's line rate, against
    which the model bounds the step's bytes; the fit's bandwidth absorbs comm_bench's own overheads and is the
    network model's) and tbf's bucket (Note [the link's bucket] in project/project_compute.cpp), both over the
    wire's bytes per counted byte of the steps that the row's first run measured (TCP/IP headers and OpenMPI's
    own messages: tc shapes what the link carries, the model charges the counted bytes), and the fit's latency."""
    if args.network:
        return f"{args.network},{tbf_bucket(args, rate) / wire_overhead:.0f}b"
    return (f"{rate_bits(rate) / 8 / wire_overhead:.0f}bps,{link['latency_s'] * 1e6:.1f}us,"
            f"{tbf_bucket(args, rate) / wire_overhead:.0f}b")


def over_hosts(args, hosts, per_host, rate, stats=None):
    """The command line up to the program: mpirun over `hosts` namespace hosts of `per_host` ranks each
    (tests/multihost/hosts.sh), each host on its own CPUs, the link shaped to `rate`, the ranks unbound;
    `stats`: the file hosts.sh writes each host's link bytes to."""
    return [os.path.join(ROOT, "tests/multihost/hosts.sh"), *own_cpus(hosts), "--hosts", str(hosts), "--slots", str(per_host),
            *shaping(args, rate), *(["--stats", stats] if stats else []), "--", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
            str(hosts * per_host)]


def on_one_host(np):
    """The command line up to the program: mpirun of `np` ranks on this machine, unbound (--bind-to none):
    the ranks share the host's cores, as the projection assumes (launch's share: cores / ranks threads
    each); OpenMPI would bind each of 1-2 ranks to one core."""
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np)]


def network_fit(args, tmp, rate, slots):
    """The link between 2 hosts of 2 ranks at `rate` as the model charges it (see the top): a dict with
    the --network text, the fitted latency and bandwidth and comm_bench's measured times per size."""
    if args.network:
        return {"network": args.network}
    bench = os.path.join(os.path.dirname(args.zeroshard), "..", "benchmarks", "comm_bench")
    out = os.path.join(tmp, f"comm_bench_{rate}_x{slots}.json")
    cmd = over_hosts(args, 2, slots, rate) + [bench, "--collective", "allgather", "--min-kib", "1", "--max-mib", "1",
                                              "--reps", "7", "--warmup", "2", "--arena", "0", "--json", out]
    run(cmd, f"comm_bench over 2 hosts at {rate}")
    with open(out) as f:
        r = json.load(f)
    times = sorted((x["bytes"], x["time_s"]) for x in r["results"] if x["collective"] == "allgather")
    latency = times[0][1]
    big = [(b, t - latency) for b, t in times[1:]]
    slope = sum(b * t for b, t in big) / sum(b * b for b, _ in big)  # seconds per byte, through the origin
    # Each rank sends B/2 across (2 hosts), its host's `slots` ranks at once: t - LATENCY = B x slots / 2 / BANDWIDTH.
    # A slope at or below zero (the load hid the bytes' time): tc's nominal rate.
    nominal = rate_bits(rate) / 8
    bandwidth = slots / 2.0 / slope if slope > 0 else nominal
    return {"network": f"{bandwidth:.0f}bps,{latency * 1e6:.1f}us", "latency_s": latency, "bytes_per_s": bandwidth,
            "allgather_s_by_bytes": {str(b): t for b, t in times},
            "fit_over_measured_by_bytes": {str(b): (latency + b * slope) / t for b, t in times}, "slots": slots}


def project(args, tmp, path, name, np, tp, pp, per_host, hosts, network, link_costs=None):
    """`zeroshard project` of the layout (its JSON)."""
    projection = os.path.join(tmp, name + (".probed" if link_costs else "") + ".projection.json")
    proj = [args.zeroshard, "project", "--config", path, "--ranks", str(np), "--ranks-per-host", str(per_host),
            "--tp", str(tp), "--pp", str(pp), "--json", projection]
    if expert_parallel(name) > 1:
        proj += ["--ep", str(expert_parallel(name))]
    if not args.idle:
        proj.append("--as-loaded")  # the runs are measured at the machine's present load
    if hosts:
        # The "hosts" are namespaces of this one machine: they share its cores.
        proj += ["--network", network, "--cores-per-host", str(max(1, (os.cpu_count() or 1) // hosts))]
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
    (docs/scaling.md, "Validation"), in the config's communication dtype (it decides the path), up to 4 MiB:
    the step's largest call, ZeRO-1/2's parameter all-gather of the whole bf16 model (1.67 MB), lies within
    the measured sizes instead of beyond them, where the projection extrapolates the last slope."""
    cpu = lay["compute_s"] / max(1.0, oversubscription)
    if lay["zero_stage"] == 3:
        work = cpu / max(1, lay["collectives_per_step"])
    elif lay["pp"] > 1:
        work = cpu / (2 * max(1, lay["micro_batches"]))
    else:
        work = cpu
    work_us = min(50000.0, max(20.0, 1e6 * work))
    bench = os.path.join(os.path.dirname(args.zeroshard), "..", "benchmarks", "step_comm_probe")
    jobs = []
    for k in range(args.probe_jobs):
        out = os.path.join(tmp, f"{name}.probe{k}.json")
        cmd = over_hosts(args, hosts, per_host, rate) + [bench, "--work-us", f"{work_us:.0f}", "--rounds", "5", "--dtype",
                                                         comm_dtype(BASE), "--max-mib", "4", "--json", out]
        run(cmd, name + " (step_comm_probe)")
        with open(out) as f:
            jobs.append(json.load(f))
    # Each call's least over the jobs, as the compute's fastest step (docs/scaling.md, "The probe's slow
    # jobs"): a probe job runs its large calls at the link's rate or, in about one job of four, at 0.5-0.6 of it
    # throughout, while the training runs held still (a ZeRO-1 step 0.206-0.207 s in every run).
    merged = jobs[0]
    for job in jobs[1:]:
        merged["compute_stretch"] = min(merged["compute_stretch"], job["compute_stretch"])
        for c, rows in merged["collectives"].items():
            for x, y in zip(rows, job["collectives"][c]):
                x["seconds"] = min(x["seconds"], y["seconds"])
    out = os.path.join(tmp, name + ".probe.json")
    with open(out, "w") as f:
        json.dump(merged, f)
    return {"file": out, "work_us": work_us, "dtype": merged["dtype"], "compute_stretch": merged["compute_stretch"],
            "jobs": len(jobs), "probe": merged,
            "seconds_by_collective": {c: {str(x["bytes"]): x["seconds"] for x in rows} for c, rows in merged["collectives"].items()},
            "seconds_by_collective_by_job": [{c: {str(x["bytes"]): x["seconds"] for x in rows} for c, rows in j["collectives"].items()}
                                             for j in jobs]}


class Case:
    """One configuration: its config file, its train command, and (two hosts) its probe, in the order the
    rounds use them (prepare, then one train run per round, then finish)."""

    def __init__(self, args, tmp, name, np, tp, pp, stage, hosts=None, rate=None, link=None):
        self.args, self.tmp, self.name, self.np, self.tp, self.pp, self.stage = args, tmp, name, np, tp, pp, stage
        self.hosts, self.rate, self.link = hosts, rate, link
        self.cfg = config_for(np, tp, pp, stage, args.steps, name, np // hosts if hosts else np)
        self.path = os.path.join(tmp, name + ".json")
        self.summary = os.path.join(tmp, name + ".summary.json")
        with open(self.path, "w") as f:
            json.dump(self.cfg, f)
        # The runs train their own copy of the config: from round 2 on it has more steps (train()).
        self.train_path = os.path.join(tmp, name + ".train.json")
        with open(self.train_path, "w") as f:
            json.dump(self.cfg, f)
        self.steps = [args.steps]
        train = [args.zeroshard, "train", "--config", self.train_path, "--summary", self.summary]
        self.stats = os.path.join(tmp, name + ".links.txt")
        if hosts:
            self.cmd = over_hosts(args, hosts, np // hosts, rate, self.stats) + train
        else:
            self.cmd = on_one_host(np) + train
        self.per_host = np // hosts if hosts else np
        self.lay0 = self.probe = self.p = self.s = None
        self.medians, self.loads, self.wire, self.wire_whole_run = [], [], [], []
        self.start_up = None  # two hosts: (link bytes, counted bytes across hosts) of a run of START_UP_STEPS
        self.projections = []  # one per round, each right after that round's run

    def prepare(self):
        """Two hosts: first the network's latency-bandwidth model, whose compute per collective sets the
        probe's work; then the probe of the in-step costs (before the first run, as the step will see it)."""
        if self.hosts:
            p0 = project(self.args, self.tmp, self.path, self.name, self.np, self.tp, self.pp, self.per_host, self.hosts,
                         self.link["network"])
            self.lay0 = p0["layouts"][0]
            self.probe = step_probe(self.args, self.tmp, self.name, self.hosts, self.per_host, self.rate, self.lay0,
                                    p0["oversubscription"])
            self.start_up = self.link_bytes(START_UP_STEPS)

    def link_bytes(self, steps):
        """A run of `steps` steps over the hosts: (the bytes every host's link sent, the bytes the ranks counted
        across hosts). Run before the first round, so that each run's bytes less these are its steps' alone."""
        path = os.path.join(self.tmp, self.name + ".start_up.json")
        summary = os.path.join(self.tmp, self.name + ".start_up.summary.json")
        stats = os.path.join(self.tmp, self.name + ".start_up.links.txt")
        with open(path, "w") as f:
            json.dump(dict(self.cfg, train_steps=steps), f)
        run(over_hosts(self.args, self.hosts, self.per_host, self.rate, stats) +
            [self.args.zeroshard, "train", "--config", path, "--summary", summary], self.name + " (start-up bytes)")
        with open(summary) as f:
            s = json.load(f)
        return sent_bytes(stats), sum(r["bytes_sent_inter_host"] for r in s["comm"]["per_rank"])

    def train(self):
        """One run: its median step (the summary's, over its steps) and the load beside it. After the first
        run the configuration trains for about --run-seconds (at least --steps steps, at most 200): a run's
        median step then holds through one of this machine's slow spells (a core at half speed for 0.4-2 s,
        docs/scaling.md), which takes every step of a half-second run."""
        if len(self.medians) == 1 and self.args.run_seconds > 0:
            steps = max(self.args.steps, min(200, math.ceil(self.args.run_seconds / max(1e-3, self.medians[0]))))
            if steps != self.steps[-1]:
                with open(self.train_path, "w") as f:
                    json.dump(dict(self.cfg, train_steps=steps), f)
            self.steps.append(steps)
        elif self.medians:
            self.steps.append(self.steps[-1])
        run(self.cmd, self.name)
        with open(self.summary) as f:
            self.s = json.load(f)
        self.medians.append(self.s["step_time_s"]["median"])
        self.loads.append(os.getloadavg()[0])
        if self.hosts:
            # The links' bytes (the kernel's tx counters, every host) over the bytes the ranks counted across
            # hosts, both less the start-up run's (self.start_up): what the wire carries per counted byte of
            # the steps. A run's whole bytes also hold what no step sends, the same in every run (OpenMPI's
            # wire-up, the set-up's broadcast, the summary's parameter digest: 8.5 MB on two hosts of 2 ranks
            # at ZeRO-1, 1.3 steps' worth of its 6.7 MB a step), so an 8-step run's whole ratio was 1.163 where
            # its steps' was 1.005 (docs/scaling.md, "The steps' wire bytes, and a pipeline's sends through
            # the link").
            sent = sent_bytes(self.stats)
            counted = sum(r["bytes_sent_inter_host"] for r in self.s["comm"]["per_rank"])
            self.wire_whole_run.append(sent / counted if counted > 0 else 1.0)
            sent0, counted0 = self.start_up
            steps_only = counted - counted0
            self.wire.append((sent - sent0) / steps_only if steps_only > 0 else self.wire_whole_run[-1])

    def project(self):
        """The projection compared, right after the first round's run (--as-loaded: the load of then)."""
        self.network = probed_network(self.args, self.rate, self.link, self.wire[0]) if self.hosts else None
        self.project_again()
        # The same with tc's rate as the counted bytes' (no wire overhead): the figure before the first run.
        self.p_line = None
        if self.hosts:
            self.p_line = project(self.args, self.tmp, self.path, self.name + ".line", self.np, self.tp, self.pp,
                                  self.per_host, self.hosts, probed_network(self.args, self.rate, self.link),
                                  self.probe["file"])

    def project_again(self):
        """The projection of this round, right after its run, with round 1's network and probe: the
        projection measures this machine's compute (the fastest of a few steps, about 0.1-2 s), which moves
        with the machine as the runs do (docs/scaling.md, "The machine's slow spells"), so it is taken as
        often as the runs and its median compared with theirs."""
        self.projections.append(project(self.args, self.tmp, self.path, self.name, self.np, self.tp, self.pp, self.per_host,
                                        self.hosts, self.network, self.probe["file"] if self.hosts else None))
        # The round whose projected step is the median's (the lower middle of an even count) gives the row's
        # projected figures.
        steps = [q["layouts"][0]["step_s"] for q in self.projections]
        self.p = self.projections[steps.index(statistics.median_low(steps))]

    def row(self):
        p, s, lay, lay0, np = self.p, self.s, self.p["layouts"][0], self.lay0, self.np
        measured = statistics.median(self.medians)
        lo, hi = min(self.medians), max(self.medians)
        spread_all = (hi - lo) / measured if measured > 0 and len(self.medians) > 1 else None  # one run: unknown
        spread = middle_spread(self.medians)
        predicted = [q["layouts"][0]["step_s"] for q in self.projections]
        # The run's mean per step over the projected step's bytes: a little above 1, since the first step's
        # window also holds the train command's start-up collectives (tests/e2e/project_agreement.cmake
        # checks one step's bytes exactly).
        bytes_ratio = max(
            s["comm"]["per_rank"][r]["bytes_sent_per_step"]["exact_mean"] / max(1, lay["ranks"][r]["bytes_sent_per_step"])
            for r in range(np))
        return {
            "name": self.name, "np": np, "tp": self.tp, "pp": self.pp, "zero_stage": self.stage, "hosts": self.hosts or 1,
            "rate": self.rate, "load_1min": self.loads[0], "loads_1min": self.loads, "network": self.link,
            "shm_collective_s": p["machine"]["shm_latency_s"], "loaded_stretch": p["machine"]["loaded_stretch"],
            # The runs' medians, one per round (interleaved with the other configurations'), their median,
            # least and most, and the spread (middle_spread): the measurement's own noise, against which the
            # 15% target is read (a row whose spread is not well below 15% gives no verdict); the spread of
            # all the runs beside it.
            "measured_step_s": measured, "measured_runs_s": self.medians, "steps_per_run": self.steps,
            "measured_min_s": lo, "measured_max_s": hi, "measured_spread": spread, "measured_spread_all": spread_all,
            # The projections, one per round, and their median (the step compared) and spread.
            "predicted_step_s": lay["step_s"], "predicted_runs_s": predicted, "predicted_spread": middle_spread(predicted),
            "predicted_over_measured": lay["step_s"] / measured if measured > 0 else None,
            "predicted_over_measured_range": [lay["step_s"] / hi, lay["step_s"] / lo] if lo > 0 else None,
            "predicted_compute_s": lay["compute_s"], "predicted_dp_exposed_s": lay["dp_exposed_s"],
            "predicted_tp_comm_s": lay["tp_comm_s"], "predicted_bubble": lay["bubble"],
            "collectives_per_step": lay["collectives_per_step"], "measured_mfu": s.get("mfu", {}).get("mfu"),
            "predicted_mfu": lay["mfu"], "bytes_mean_over_projected": bytes_ratio,
            "compute_stretch": p["oversubscription"],
            "predicted_network_model_s": lay0["step_s"] if lay0 else None,
            "line_rate_over_measured": self.p_line["layouts"][0]["step_s"] / measured if self.p_line and measured > 0 else None,
            "network_model_over_measured": lay0["step_s"] / measured if lay0 and measured > 0 else None,
            "step_probe": self.probe,
            "probed_network": self.network,
            # Each run's link bytes (tx, every host) over its counted bytes across hosts, its steps' alone (less
            # the start-up run's), and its whole run's.
            "wire_over_counted_bytes": self.wire or None,
            "wire_over_counted_bytes_whole_run": self.wire_whole_run or None,
            "start_up_steps": START_UP_STEPS if self.hosts else None,
        }


def sent_bytes(stats):
    """The bytes every host's link sent in a run (hosts.sh --stats: one line "hN tx_bytes" per host)."""
    with open(stats) as f:
        return sum(int(line.split()[1]) for line in f if line.strip())


def middle_spread(values):
    """(most - least) / median of the values, the least and the most left out where there are 5 or more:
    one run caught in one of this machine's slow spells (a core at half speed for 0.4-2 s, docs/scaling.md)
    then moves neither the median nor the spread; None for one value."""
    if len(values) < 2:
        return None
    v = sorted(values)
    if len(v) >= 5:
        v = v[1:-1]
    med = statistics.median(values)
    return (v[-1] - v[0]) / med if med > 0 else None


def within(rows, key):
    """'k of n': how many of the rows' `key` ratios lie within 15% of 1."""
    return f"{sum(1 for r in rows if r.get(key) and 0.85 <= r[key] <= 1.15)} of {len(rows)}"


# The steps of the short run each two-host row makes before its first round, whose link and counted bytes
# every run's are taken less of (Case.link_bytes): the bytes of what is not a step drop out.
START_UP_STEPS = 2

# A row's verdict needs its measurement to hold still: a spread over the rounds (most - least over the
# median) above a third of the 15% target says the machine, not the model, decides that row.
QUIET_SPREAD = 0.05


def table(rows):
    """The rows as a Markdown table (stderr): the measurement's spread beside the verdict."""
    out = ["| configuration | collectives / step | measured step (s): median [least, most] over rounds | spread | "
           "predicted (s): median (spread) | **predicted / measured** [over most, over least] | at tc's rate, no wire overhead | "
           "network model only |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rng = r["predicted_over_measured_range"] or [0, 0]
        nm = f"{r['network_model_over_measured']:.2f}" if r["network_model_over_measured"] else "-"
        lr = f"{r['line_rate_over_measured']:.2f}" if r.get("line_rate_over_measured") else "-"
        sp = r["measured_spread"]
        spread = "-" if sp is None else f"{100 * sp:.1f}%" + ("" if sp <= QUIET_SPREAD else " (noisy)")
        psp = r.get("predicted_spread")
        pspread = "" if psp is None else f" ({100 * psp:.1f}%)"
        out.append(f"| {r['name']} | {r['collectives_per_step']} | {r['measured_step_s']:.4f} [{r['measured_min_s']:.4f}, "
                   f"{r['measured_max_s']:.4f}] | {spread} | {r['predicted_step_s']:.4f}{pspread} | "
                   f"**{r['predicted_over_measured']:.2f}** [{rng[0]:.2f}, {rng[1]:.2f}] | {lr} | {nm} |")
    return "\n".join(out)


def reproject(args):
    """--reproject FILE: the projection again over a saved run's measurements (docs/scaling.md, "The link's
    bucket"): each row's configuration projected with this zeroshard, its two-host rows with the probe the
    run kept (rows[].step_probe.probe) and its rows[].probed_network, nothing trained or probed. The new
    step is the saved projection's compute plus the new projection's step beyond its compute, so that the
    model's change shows apart from this moment's compute; compared with the saved measured step."""
    with open(args.reproject) as f:
        saved = json.load(f)
    rows, out = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in saved["rows"]:
            if args.only and not any(x in r["name"] for x in args.only.split(",")):
                continue
            hosts = r["hosts"] if r["hosts"] > 1 else None
            costs = None
            if hosts:
                probe = (r.get("step_probe") or {}).get("probe")
                if probe is None or not r.get("probed_network"):
                    sys.exit(f"--reproject: {args.reproject}: row {r['name']} keeps no probe (rows[].step_probe.probe) or "
                             "probed network (rows[].probed_network); give the JSON of a run of this script since it keeps them")
                costs = os.path.join(tmp, r["name"] + ".probe.json")
                with open(costs, "w") as f:
                    json.dump(probe, f)
            path = os.path.join(tmp, r["name"] + ".json")
            per_host = r["np"] // (hosts or 1)
            with open(path, "w") as f:
                json.dump(config_for(r["np"], r["tp"], r["pp"], r["zero_stage"], args.steps, r["name"], per_host), f)
            lay = project(args, tmp, path, r["name"], r["np"], r["tp"], r["pp"], per_host, hosts, r.get("probed_network"),
                          costs)["layouts"][0]
            step = r["predicted_compute_s"] + (lay["step_s"] - lay["compute_s"])
            ratio = step / r["measured_step_s"]
            rows.append(ratio)
            out.append({"name": r["name"], "measured_step_s": r["measured_step_s"], "saved_predicted_step_s": r["predicted_step_s"],
                        "saved_predicted_over_measured": r["predicted_over_measured"], "predicted_step_s": step,
                        "predicted_over_measured": ratio})
            print(f"{r['name']}: measured {r['measured_step_s']:.4f} s, saved {r['predicted_over_measured']:.2f}, "
                  f"now {ratio:.2f}", file=sys.stderr)
    print(json.dumps({"reprojected": args.reproject, "rows": out,
                      "within_15_percent": f"{sum(1 for q in rows if 0.85 <= q <= 1.15)} of {len(rows)}"}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", default=os.path.join(ROOT, "build/release/tools/zeroshard"))
    ap.add_argument("--steps", type=int, default=8, help="training steps per run (the median excludes nothing)")
    ap.add_argument("--quick", action="store_true", help="np 1 and 2 only, 4 steps")
    ap.add_argument("--run-seconds", type=float, default=3.0,
                    help="rounds 2.. train each configuration for about this long (at least --steps steps, at most "
                         "200; 0: --steps), so that a run's median step holds through a slow spell of the machine")
    ap.add_argument("--multihost", action="store_true", help="also two hosts of 2 ranks under tc (needs root)")
    ap.add_argument("--repeats", "--repeat", type=int, default=1,
                    help="rounds: each trains and projects every configuration once, interleaved (odd rounds in "
                         "order, even ones reversed); the measured step is the median of a configuration's runs, "
                         "their least and most beside it, the predicted step the median of its projections")
    ap.add_argument("--idle", action="store_true", help="project an idle host's compute (without --as-loaded)")
    ap.add_argument("--network", default="",
                    help="a fixed BANDWIDTH,LATENCY for the two-host rows (default: measured per rate, see the top)")
    ap.add_argument("--only", default="", help="comma-separated substrings: only configurations whose name has one")
    ap.add_argument("--burst", type=int, default=0,
                    help="tbf's bucket in bytes for every two-host run (hosts.sh --burst; default: hosts.sh's)")
    ap.add_argument("--rates", default=",".join(MULTIHOST_RATES), help="the two-host rows' tc rates (comma-separated)")
    ap.add_argument("--reproject", default="", metavar="FILE",
                    help="project again over a saved run's JSON (its measurements and probes), training nothing")
    ap.add_argument("--probe-jobs", type=int, default=2,
                    help="step_comm_probe jobs per two-host row; each call's least over them is projected (default 2)")
    args = ap.parse_args()
    if args.repeats < 1:
        sys.exit(f"--repeats: {args.repeats} is below 1; give the number of rounds (1 or more)")
    if args.probe_jobs < 1:
        sys.exit(f"--probe-jobs: {args.probe_jobs} is below 1; give the number of probe jobs per two-host row (1 or more)")
    if args.reproject:
        return reproject(args)
    wanted = lambda name: not args.only or any(x in name for x in args.only.split(","))
    if args.quick:
        args.steps = 4
    specs = [dict(name=name, np=np, tp=tp, pp=pp, stage=stage)
             for name, np, tp, pp, stage in ONE_HOST if (not args.quick or np <= 2) and wanted(name)]
    if args.multihost:
        for rate in args.rates.split(","):
            specs += [dict(name=f"{base}_{rate}", np=np, tp=tp, pp=pp, stage=stage, hosts=2, rate=rate, slots=slots)
                      for base, slots, np, tp, pp, stage in MULTIHOST if wanted(f"{base}_{rate}")]
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        # Round 1 prepares each configuration (the link's fit per rate and host layout, the probe), runs
        # it and projects it; rounds 2.. run them again, interleaved, so that a minute of load shows as
        # one configuration's spread instead of deciding its verdict.
        cases, links = [], {}
        for spec in specs:
            slots = spec.pop("slots", None)
            if slots is not None and (spec["rate"], slots) not in links:
                links[(spec["rate"], slots)] = network_fit(args, tmp, spec["rate"], slots)
            case = Case(args, tmp, **spec, link=links.get((spec.get("rate"), slots)))
            case.prepare()
            case.train()
            case.project()
            cases.append(case)
            print(f"{case.name}: measured {case.medians[-1]:.4f} s, predicted {case.p['layouts'][0]['step_s']:.4f} s",
                  file=sys.stderr)
        for k in range(2, args.repeats + 1):
            for case in (cases if k % 2 else reversed(cases)):
                case.train()
                case.project_again()
            print(f"round {k} of {args.repeats}: load {os.getloadavg()[0]:.2f}", file=sys.stderr)
        rows = [c.row() for c in cases]
    ratios = [r["predicted_over_measured"] for r in rows if r["predicted_over_measured"]]
    quiet = [r for r in rows if r["measured_spread"] is not None and r["measured_spread"] <= QUIET_SPREAD]
    out = {
        "load_at_start": load_at_start, "load_at_end": os.getloadavg(), "rounds": args.repeats,
        "tbf_burst_bytes": args.burst or None,  # None: hosts.sh's default (10 ms of the rate, at least 64 KiB)
        "rows": rows,
        "within_15_percent": sum(1 for q in ratios if 0.85 <= q <= 1.15),
        "within_15_percent_one_host": within([r for r in rows if r["hosts"] == 1], "predicted_over_measured"),
        "within_15_percent_two_hosts": within([r for r in rows if r["hosts"] > 1], "predicted_over_measured"),
        "network_model_within_15_percent_two_hosts": within([r for r in rows if r["hosts"] > 1],
                                                            "network_model_over_measured"),
        # Only the rows whose runs held still (spread <= QUIET_SPREAD) give a verdict; the others are named.
        "quiet_spread_limit": QUIET_SPREAD,
        "within_15_percent_of_quiet_rows": within(quiet, "predicted_over_measured"),
        "noisy_rows": [r["name"] for r in rows if r["measured_spread"] is not None and r not in quiet],
        "measured_spread_max": max((r["measured_spread"] or 0) for r in rows),
        "configurations": len(rows),
        "bytes_mean_over_projected_max": max(r["bytes_mean_over_projected"] for r in rows),
    }
    print(table(rows), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
