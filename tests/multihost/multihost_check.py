#!/usr/bin/env python3
"""`zeroshard train` on two hosts of two ranks (network namespaces, tests/multihost/hosts.sh; docs/multihost.md).

  equal  ZeRO stages 0-3 of examples/configs/gpt_tiny.json (6 steps) on one host at np 4 and on two hosts
         of 2: the same losses and the same param_digest (Note [Sum order across hosts] in
         comm/detail/transport_hierarchical.cpp); on one host no bytes cross hosts; on two, every rank's
         bytes across hosts come from the counters by Note [Bytes across hosts] (comm/config.h): the
         ranks' sum is (N - R) / (N - 1) of their bytes sent for the gathers and reduce-scatters, and the
         allreduces' small remainder is bounded by the bytes they sent; and the kernel's count of the
         bytes the hosts' links carried is set beside the counters' (printed; asserted within 1.0-1.6x for
         stages 1-3: TCP/IP headers, OpenMPI's launch and handshakes on top; 0.4-0.7x at stage 0, whose
         allreduces the hierarchical transport sends once per host, not once per rank).
  zeropp ZeRO-3 with every module released after use (stage3_max_reuse_distance 0,
         stage3_param_persistence_threshold 0) with hpZ (zero_hpz_partition_size 2), then with hpZ + qwZ + qgZ,
         6 steps, on one host at np 4 and on two hosts of 2: the same losses and param_digest (every ZeRO++
         sum is in a fixed rank order, whatever the transport); across hosts, from rank 0's comm.ops, hpZ's
         model collectives send exactly 2 (N-R)/N Psi x 4 bytes per step (the forward's gather and the
         reduce-scatter: the backward gathers inside the host), and all three send (N-R+O-1)/N Psi q bytes
         (q = 1 + 4/256: int8 blocks with fp32 scales) plus under 8 bytes per piece crossing hosts
         (comm::int8_words' rounding), under 0.25x of plain ZeRO-3's 3 (N-R)/N Psi x 4.
  fault  a rank on the second host SIGKILLed, then (another job) SIGSTOPped, after the first step: every
         process of the job ends within comm.timeout_s + 30 s, and the output names the collective and
         its group (a survivor's CommError) or the killed rank (mpirun's report).

  multihost_check.py --zeroshard build/release/tools/zeroshard --config examples/configs/gpt_tiny.json \
      --hosts-sh tests/multihost/hosts.sh --out DIR equal|zeropp|fault
Exit 0 when every check passed, 77 when this machine cannot make network namespaces (not root).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

N, R = 4, 2  # two hosts of two ranks
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
# A survivor's fatal CommError names the collective and its group; mpirun names a killed rank.
NAMED = re.compile(r"(rank \d+: fatal: (allreduce|reduce_scatter|allgatherv?|broadcast|alltoallv?|barrier|send|recv|sendrecv)"
                   r"\(.*?\) on group '[^']+'.*?(timed out|No such process|failed))|(exited on signal 9)", re.S)


def write_config(args, stage, name, steps=6, extra=None):
    with open(args.config) as f:
        cfg = json.load(f)
    cfg["zero_optimization"]["stage"] = stage
    cfg["train_steps"] = steps
    cfg.update(extra or {})
    path = os.path.join(args.out, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(cmd, log, timeout=600):
    env = dict(os.environ, **MPI_ENV)
    with open(log, "w") as out:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    return p.returncode


def two_hosts(args, extra_hosts=()):
    return [args.hosts_sh, "--hosts", "2", "--slots", "2", *extra_hosts, "--"]


def one_and_two_hosts(args, label, config, prefix, failures, extra_hosts=()):
    """Trains `config` on N ranks of one host, then of two hosts of R; their losses and param_digest
    must be equal. Returns both summaries (one host, two hosts), None after a failed run, or 77 when
    this machine cannot make the namespaces. Failures are appended to `failures`, named by `label`."""
    one, two = (os.path.join(args.out, f"{prefix}_{w}") for w in ("one", "two"))
    train = [args.zeroshard, "train", "--config", config, "--summary"]
    rc = run(["mpirun", "--oversubscribe", "-np", str(N)] + train + [one + ".json"], one + ".log")
    if rc != 0:
        failures.append(f"{label}: one host failed (exit {rc}, {one}.log)")
        return None
    rc = run(two_hosts(args, extra_hosts) + ["-np", str(N)] + train + [two + ".json"], two + ".log")
    if rc == 77:
        print(open(two + ".log").read().strip())
        return 77
    if rc != 0:
        failures.append(f"{label}: two hosts failed (exit {rc}, {two}.log)")
        return None
    a, b = (json.load(open(p + ".json")) for p in (one, two))
    if a["loss_history"] != b["loss_history"]:
        failures.append(f"{label}: losses differ: one host {a['loss_history']}, two hosts {b['loss_history']}")
    if a["param_digest"] != b["param_digest"]:
        failures.append(f"{label}: param_digest differs: one host {a['param_digest']}, two hosts {b['param_digest']}")
    return a, b


def check_equal(args):
    failures = []
    table = []
    for stage in range(4):
        cfg = write_config(args, stage, f"stage{stage}")
        stats = os.path.join(args.out, f"stage{stage}_links.txt")
        got = one_and_two_hosts(args, f"stage {stage}", cfg, f"stage{stage}", failures, ["--stats", stats])
        if got == 77:
            return 77
        if got is None:
            continue
        a, b = got
        for r in a["comm"]["per_rank"]:
            if r["bytes_sent_inter_host"] != 0 or r["bytes_sent_intra_host"] != r["bytes_sent"]:
                failures.append(f"stage {stage}: one host, rank {r['rank']} counts bytes across hosts: {r}")
        ranks = b["comm"]["per_rank"]
        sent = sum(r["bytes_sent"] for r in ranks)
        inter = sum(r["bytes_sent_inter_host"] for r in ranks)
        for r in ranks:
            if r["bytes_sent_inter_host"] + r["bytes_sent_intra_host"] != r["bytes_sent"]:
                failures.append(f"stage {stage}: rank {r['rank']}: inter + intra != bytes_sent: {r}")
        # Gathers and reduce-scatters give exactly (N - R) / (N - 1) of their bytes; allreduces (losses,
        # norms: a few elements) the rest, at most their own bytes sent (Note [Bytes across hosts]).
        mean_sent = sum(r["bytes_sent_per_step"]["exact_mean"] for r in ranks) / N
        mean_inter = sum(r["bytes_sent_per_step"]["exact_inter_host_mean"] for r in ranks) / N
        if not abs(inter - sent * (N - R) / (N - 1)) <= sent / 1000:
            failures.append(f"stage {stage}: bytes across hosts {inter} are not (N-R)/(N-1) = 2/3 of bytes sent {sent}")
        links = {}
        for line in open(stats):
            host, tx = line.split()
            links[host] = int(tx)
        wire = sum(links.values())
        ratio = wire / inter if inter else 0.0
        # Stage 0 allreduces through the hierarchical chain: each host's partial sums cross once each way
        # (2 n per allreduce for the job, where the counters' rule gives the ranks 4 n together).
        low, high = (0.4, 0.7) if stage == 0 else (1.0, 1.6)
        if not low <= ratio <= high:
            failures.append(f"stage {stage}: the links carried {wire} bytes for {inter} counted across hosts ({ratio:.2f}x)")
        table.append((stage, a["loss_history"][-1], a["param_digest"] == b["param_digest"], mean_sent, mean_inter,
                      inter, wire, ratio, b["step_time_s"]["median"], a["step_time_s"]["median"]))
    print("stage | final loss | digest equal | bytes sent/step/rank | across hosts/step/rank | across hosts (all ranks) "
          "| link bytes (kernel) | link / counted | step s 2 hosts | step s 1 host")
    for t in table:
        print("{} | {:.6f} | {} | {:.0f} | {:.0f} | {} | {} | {:.2f} | {:.4f} | {:.4f}".format(*t))
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def check_zeropp(args):
    failures = []
    released = {"stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 0}
    variants = {"hpz": {"zero_hpz_partition_size": R},
                "all": {"zero_hpz_partition_size": R, "zero_quantized_weights": True, "zero_quantized_gradients": True}}
    hosts = N // R
    for name, keys in variants.items():
        with open(args.config) as f:
            cfg = json.load(f)
        cfg["zero_optimization"].update(stage=3, **released, **keys)
        cfg["train_steps"] = 6
        path = os.path.join(args.out, f"zeropp_{name}.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        got = one_and_two_hosts(args, name, path, f"zeropp_{name}", failures)
        if got == 77:
            return 77
        if got is None:
            continue
        a, b = got
        psi, steps, ops = b["params_total"], b["steps"], b["comm"]["ops"]
        model = sum(ops.get(k, {}).get("bytes_inter_host", 0) for k in ("allgatherv", "reduce_scatter", "alltoallv")) / steps
        pieces = (N - R) * sum(ops.get(k, {}).get("count", 0) for k in ("allgatherv", "alltoallv")) / steps
        zero3 = 3 * (N - R) / N * psi * 4
        if name == "hpz":
            want, slack = 2 * (N - R) / N * psi * 4, 0
        else:
            want, slack = (N - R + hosts - 1) / N * psi * (1 + 4 / 256), 8 * pieces
        if not want <= model <= want + slack:
            failures.append(f"{name}: rank 0's model collectives sent {model} bytes across hosts per step, not {want:.0f}"
                            f" (+ up to {slack:.0f}): {ops}")
        if name == "all" and not model <= 0.25 * zero3:
            failures.append(f"{name}: {model} bytes across hosts per step is more than 0.25x ZeRO-3's {zero3:.0f}")
        print(f"{name}: losses and digest {'equal' if a['param_digest'] == b['param_digest'] else 'DIFFER'} "
              f"(final loss {b['final_loss']:.6f}); across hosts per step, rank 0's model collectives {model:.0f} bytes "
              f"(formula {want:.0f}; {model / zero3:.3f}x ZeRO-3's {zero3:.0f})")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def rank_pids(ns):
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in out:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"zeroshard" in f.read().split(b"\0")[0]:
                    pids.append(int(pid))
        except OSError:
            pass
    return sorted(pids)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def check_fault(args):
    failures = []
    timeout_s = 10
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        cfg = write_config(args, 3, f"fault_{sig.name}", steps=1_000_000, extra={"comm": {"timeout_s": timeout_s},
                                                                                 "steps_per_print": 1})
        log = os.path.join(args.out, f"fault_{sig.name}.log")
        env = dict(os.environ, **MPI_ENV)
        proc = subprocess.Popen(two_hosts(args) + ["-np", str(N), args.zeroshard, "train", "--config", cfg],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        lines = []
        started = threading.Event()

        def pump():
            for line in proc.stdout:
                lines.append(line)
                if re.search(r"step [1-9]\d*/", line):
                    started.set()
        t = threading.Thread(target=pump, daemon=True)
        t.start()
        if not started.wait(300):
            proc.kill()
            if proc.wait() == 77:
                print("".join(lines).strip())
                return 77
            failures.append(f"{sig.name}: no first step within 300 s:\n{''.join(lines)[-2000:]}")
            continue
        ns = f"zs{proc.pid}-h1"  # hosts.sh's names (its pid), the second host
        victims = rank_pids(ns)
        if not victims:
            failures.append(f"{sig.name}: no rank found in namespace {ns}")
            proc.kill()
            continue
        time.sleep(0.3)
        signalled = time.monotonic()
        os.kill(victims[0], sig)
        try:
            proc.wait(timeout=timeout_s + 30)
        except subprocess.TimeoutExpired:
            failures.append(f"{sig.name}: the job still ran {timeout_s + 30} s after the signal")
            proc.kill()
            proc.wait()
        took = time.monotonic() - signalled
        t.join(5)
        text = "".join(lines)
        with open(log, "w") as f:
            f.write(text)
        named = NAMED.search(text)
        if proc.returncode == 0 or named is None:
            failures.append(f"{sig.name}: exit {proc.returncode}, no collective and group (or killed rank) named ({log})")
        leftover = victims
        for _ in range(50):  # hosts.sh killed what was left in the namespaces; the kernel reaps it
            leftover = [p for p in leftover if alive(p)]
            if not leftover:
                break
            time.sleep(0.1)
        print(f"{sig.name} to rank pid {victims[0]} on host h1: every rank ended {took:.1f} s later (comm.timeout_s "
              f"{timeout_s}), exit {proc.returncode}: {named.group(0)[:300] if named else '(nothing named)'}")
        if leftover:
            failures.append(f"{sig.name}: processes {leftover} still exist")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", required=True)
    ap.add_argument("--config", required=True, help="a GPT config (examples/configs/gpt_tiny.json)")
    ap.add_argument("--hosts-sh", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("mode", choices=["equal", "zeropp", "fault"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sys.exit({"equal": check_equal, "zeropp": check_zeropp, "fault": check_fault}[args.mode](args))


if __name__ == "__main__":
    main()
