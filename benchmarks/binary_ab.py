#!/usr/bin/env python3
"""Step time of two zeroshard builds on benchmarks/project_validate.py's configurations, interleaved.

Question: does a change to the engine or comm make a configuration's training step faster or slower? The
baseline is measured in the same run: each round trains every configuration once with each binary (the
order of the two alternates from round to round), so a slow spell of this machine falls on both. A
configuration's figure is the median over rounds of each run's median step (the summary's step_time_s).

  python3 benchmarks/binary_ab.py --baseline OLD/tools/zeroshard --candidate build/release/tools/zeroshard \\
      --configs np2_tp2,np4_dp2_tp2,2hosts_x2_zero3@10gbit [--rounds 4] [--steps 60] > ab.json

--configs names project_validate.py's configurations (ONE_HOST, MULTIHOST); a two-host one takes its tc
rate after "@" and runs over tests/multihost/hosts.sh (root: network namespaces), each host on its own
CPUs, as the validation runs it. The JSON: per configuration the runs of both binaries (seconds), their
medians and candidate_over_baseline (below 1: the candidate is faster); the runs go to stderr as they end.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import project_validate as pv  # noqa: E402  (the configurations and the launch command lines)


def layouts():
    """Every configuration by name: (np, tp, pp, ZeRO stage, hosts or None)."""
    out = {name: (np, tp, pp, stage, None) for name, np, tp, pp, stage in pv.ONE_HOST}
    out.update({name: (np, tp, pp, stage, np // per_host) for name, per_host, np, tp, pp, stage in pv.MULTIHOST})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the zeroshard binary before the change")
    ap.add_argument("--candidate", required=True, help="the zeroshard binary after it")
    ap.add_argument("--configs", required=True, help="comma-separated configuration names, two-host ones NAME@RATE")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    known = layouts()
    cases = []
    for given in args.configs.split(","):
        name, _, rate = given.partition("@")
        if name not in known:
            sys.exit(f"binary_ab.py: --configs: no configuration '{name}'; known: {', '.join(known)}")
        if (known[name][4] is not None) != bool(rate):
            sys.exit(f"binary_ab.py: --configs: '{given}': give a two-host configuration's tc rate as NAME@RATE "
                     "(e.g. @1gbit), and none to a one-host one")
        cases.append((given, name, rate))
    # hosts.sh's flags (--burst): the validation's defaults.
    hosts_args = argparse.Namespace(burst=0)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    runs = {given: {"baseline": [], "candidate": []} for given, _, _ in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = [("baseline", args.baseline), ("candidate", args.candidate)]
            if r % 2:
                order.reverse()
            for given, name, rate in cases:
                np, tp, pp, stage, hosts = known[name]
                cfg = os.path.join(tmp, name + ".json")
                with open(cfg, "w") as f:
                    json.dump(pv.config_for(np, tp, pp, stage, args.steps, name, np // hosts if hosts else np), f)
                for tag, binary in order:
                    summary = os.path.join(tmp, "summary.json")
                    train = [binary, "train", "--config", cfg, "--summary", summary]
                    if hosts:
                        cmd = pv.over_hosts(hosts_args, hosts, np // hosts, rate) + train
                    else:
                        cmd = pv.on_one_host(np) + train
                    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                    if p.returncode:
                        sys.exit(f"binary_ab.py: {given} with {binary} exited {p.returncode}:\n{p.stdout[-3000:]}")
                    with open(summary) as f:
                        step = json.load(f)["step_time_s"]["median"]
                    runs[given][tag].append(step)
                    print(f"round {r + 1}: {given} {tag} {step:.4f} s", file=sys.stderr, flush=True)
    out = {"baseline": args.baseline, "candidate": args.candidate, "rounds": args.rounds, "steps": args.steps,
           "configurations": {}}
    for given, _, _ in cases:
        b, c = statistics.median(runs[given]["baseline"]), statistics.median(runs[given]["candidate"])
        out["configurations"][given] = {"baseline_runs_s": runs[given]["baseline"], "candidate_runs_s": runs[given]["candidate"],
                                        "baseline_median_s": b, "candidate_median_s": c, "candidate_over_baseline": c / b}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
