#!/usr/bin/env python3
"""Fault injection for `zeroshard train` under mpirun (docs/reliability.md).

Rank trials: start an np-rank training job (one of five scenarios), wait until it has trained its first
step, sleep a random moment, then SIGKILL or SIGSTOP one random rank. Passes when every process of the
job is gone within comm.timeout_s + 30 s of the signal and the output names what failed:
  SIGKILL  mpirun's "process rank R ... exited on signal 9" for the killed rank R, or a survivor's fatal
           error naming the collective and group whose peer process is gone ("allgatherv(...) on group
           'dp' ...: reading ... with process_vm_readv failed (No such process)");
  SIGSTOP  a surviving rank's CommError naming the collective and its group ("allreduce(...) on group dp
           ... timed out").
Scenarios: collectives (ZeRO-1: reduce-scatter/allgather), zero3 (ZeRO-3 parameter gathers), nvme (ZeRO-3
with optimizer states and parameters swapped to NVMe files), moe (GPT-MoE, expert all-to-all), checkpoint
(ZeRO-2 saving a checkpoint after every step with `--save`, so most moments fall inside a save), tp
(model.tensor_parallel_size 2 with sequence parallelism: every collective is the "tp" group's, and a
SIGSTOP must be named as a collective on group 'tp' that timed out). After a
checkpoint trial the tag `latest` names must load whole (`zeroshard checkpoint compare` reads every
element of it) and no partial tag may be visible; the JSON records whether the signal left a save's
staging directory behind (it landed inside a save).

Start-up: a job that exits before its first step, or has not reached it after --start-limit-s (600),
fails its trial (with its ranks' states, CPU seconds and gdb stacks); one that takes more than
--slow-start-s (120) still runs its trial but is counted apart as a slow start (wait_for_start).

Storage trials (--storage; need `unshare -m` and mount, else skipped): the NVMe swap directory on a
read-only file system, on a file system too small for the swap files (both must fail before training,
naming the path and the bytes), and on tmpfs (no O_DIRECT on older kernels; training must still run).

  fault_trials.py --zeroshard build/release/tools/zeroshard --trials 20 --timeout-s 3 --seed 1
  fault_trials.py --zeroshard ... --trials 200 --cycle --timeout-s 3 --seed 2 --storage --json out.json  # long mode
Exit 0 when every trial passed.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SCENARIOS = ["collectives", "zero3", "nvme", "moe", "checkpoint", "tp", "pp"]
# ZeRO-3's one-sided gathers on one node (comm::SharedShards) name their side of the exchange instead:
# "one-sided allgatherv on group 'dp' ... timed out" reading, "one-sided shard write on group ..." when
# the next write waits for a peer still reading the last version.
COLLECTIVE = (r"(allreduce|reduce_scatter|allgatherv?|broadcast|alltoallv?|barrier)\(.*?\) on .*?timed out"
              r"|one-sided (allgatherv|shard write) on group '[^']+'.*?timed out")
# The tp scenario (dp 1 x tp 2: every collective is the tensor-parallel group's) must name that group.
TP_COLLECTIVE = r"(allreduce|reduce_scatter|allgatherv?|broadcast)\(.*?\) on group 'tp'.*?timed out"
# The pp scenario (two pipeline stages): a transfer or collective of the "pp" group, naming the peer it
# waited for (a send/recv's rank, the loss broadcast's root) or the group's other ranks.
PP_OP = r"(send|recv|sendrecv|allreduce|allgather|broadcast)\(.*?\) on group 'pp'.*?timed out"
PEER_GONE = r"(allreduce|reduce_scatter|allgatherv?|broadcast|alltoallv?|barrier)\(.*?\) on group '[^']+'.*?No such process"


def config(scenario, timeout_s, nvme_dir, steps=1_000_000):
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "train_steps": steps,
        "steps_per_print": 1_000_000,
        "comm": {"timeout_s": timeout_s},
        "device": {"memory_mb": 256},
        "model": {"n_layer": 2, "d_model": 64, "n_head": 4, "seq_len": 32},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 1},
    }
    if scenario == "zero3":
        cfg["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 0}
    elif scenario == "nvme":
        cfg["zero_optimization"] = {
            "stage": 3, "stage3_param_persistence_threshold": 0,
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme_dir},
            "offload_param": {"device": "nvme", "nvme_path": nvme_dir}}
    elif scenario == "checkpoint":
        cfg["zero_optimization"] = {"stage": 2}
        cfg["checkpoint"] = {"save_interval": 1, "keep_last": 2}
    elif scenario == "tp":
        # Tensor parallelism with sequence parallelism at np 2: the layers' all-reduces, reduce-scatters
        # and all-gathers over the "tp" group, ZeRO-2 over a data-parallel group of one.
        cfg["zero_optimization"] = {"stage": 2}
        cfg["model"].update(tensor_parallel_size=2, sequence_parallel=True)
    elif scenario == "pp":
        # Two pipeline stages under ZB-H1, 4 micro-batches a step: activations and gradients between the
        # stages, the loss broadcast and the gradient norm's sum over the "pp" group.
        cfg["gradient_accumulation_steps"] = 4
        cfg["model"]["pipeline_parallel_size"] = 2
        cfg["pipeline"] = {"schedule": "zb-h1"}
    elif scenario == "moe":
        cfg["zero_optimization"] = {"stage": 2}
        cfg["model"]["tied_embeddings"] = False
        cfg["model"]["moe"] = {"num_experts": 2, "ep_size": 2, "every_n_layers": 1}
    return cfg


def mpirun(np_, zeroshard, cfg_path, prefix=(), extra=()):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = list(prefix) + ["mpirun", "--oversubscribe", "-np", str(np_), zeroshard, "train", "--config", cfg_path]
    cmd += list(extra)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                            start_new_session=True)


def rank_pids(root_pid):
    """{rank: pid} of the job's processes: descendants of root_pid with OMPI_COMM_WORLD_RANK set."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    ranks, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            try:
                with open(f"/proc/{child}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            for kv in env:
                if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                    ranks[int(kv.split(b"=", 1)[1])] = child
    return ranks


class Output:
    """Collects a process's output on a thread; wait_for(regex) blocks until it appears, the output ends
    (the job exited) or the time is up."""

    def __init__(self, proc):
        self.text, self.ended, self.cond = "", False, threading.Condition()
        self.thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self.thread.start()

    def _pump(self, proc):
        for line in proc.stdout:
            with self.cond:
                self.text += line
                self.cond.notify_all()
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def wait_for(self, regex, timeout):
        end = time.monotonic() + timeout
        with self.cond:
            while not re.search(regex, self.text):
                left = end - time.monotonic()
                if left <= 0 or self.ended:
                    return False
                self.cond.wait(left)
        return True


def cpu_seconds(pids):
    """User + system CPU seconds the processes have used so far (processes gone count 0)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def start_snapshot(root_pid):
    """What a job that has not reached step 1 is doing: per rank its state, kernel wait channel and CPU
    seconds, and the machine's load average."""
    ranks = rank_pids_safe_map(root_pid)
    snap = {"load": os.getloadavg()[0], "cpu_s": round(cpu_seconds(ranks.values()), 2), "ranks": {}}
    for rank, pid in sorted(ranks.items()):
        info = {}
        for name in ("wchan",):
            try:
                with open(f"/proc/{pid}/{name}") as f:
                    info[name] = f.read().strip()
            except OSError:
                pass
        try:
            with open(f"/proc/{pid}/stat") as f:
                info["state"] = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            pass
        info["cpu_s"] = round(cpu_seconds([pid]), 2)
        snap["ranks"][rank] = info
    return snap


def backtraces(root_pid):
    """Every rank's threads' stacks (gdb, where installed): the evidence a start-up hang needs."""
    if shutil.which("gdb") is None:
        return "gdb not installed"
    out = []
    for rank, pid in sorted(rank_pids_safe_map(root_pid).items()):
        try:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
            frames = [line for line in r.stdout.splitlines() if line.startswith(("#", "Thread "))]
            out.append(f"rank {rank} (pid {pid}):\n" + "\n".join(frames))
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(f"rank {rank} (pid {pid}): gdb failed: {e}")
    return "\n".join(out)[-12000:]


def wait_for_start(out, proc, regex, args, result):
    """Waits until the job reaches `regex` (its first step, or its first save). A job that exits first, or
    has not got there after --start-limit-s, fails the trial. One that gets there after more than
    --slow-start-s still runs its trial, but counts as a slow start (result["slow_start"]) with a
    snapshot of its ranks taken at --slow-start-s: on this shared 2-core machine a niced job next to a
    benchmark at normal priority gets ~1.5% of a core, so an MPI start and model build of a few CPU
    seconds can take minutes. The CPU seconds in the snapshots tell a starved job (still using CPU) from
    a stuck one (none used). Returns True when the job started."""
    t0 = time.monotonic()
    started = out.wait_for(regex, args.slow_start_s)
    if not started and not out.ended:
        result["slow_start"] = start_snapshot(proc.pid)
        started = out.wait_for(regex, max(0.0, args.start_limit_s - args.slow_start_s))
    result["start_s"] = round(time.monotonic() - t0, 1)
    if started:
        return True
    if out.ended:
        proc.wait()
        result.update(outcome="exited before step 1", exit=proc.returncode, passed=False)
    else:
        result.update(outcome="did not start", passed=False, at_limit=start_snapshot(proc.pid),
                      backtraces=backtraces(proc.pid))
    out.thread.join(1)
    result["output_tail"] = out.text[-3000:]
    return False


def rank_trial(i, rng, args, work):
    scenarios = args.scenarios.split(",")
    scenario = scenarios[i % len(scenarios)] if args.cycle else rng.choice(scenarios)
    if args.cycle:
        # Scenarios in turn, the signals alternating within a round and swapped in the next: one round
        # gives every scenario one signal (half of them each), two rounds give every scenario both. The
        # rank and the moment stay random.
        sig = [signal.SIGKILL, signal.SIGSTOP][(i % len(scenarios) + i // len(scenarios)) % 2]
    else:
        sig = rng.choice([signal.SIGKILL, signal.SIGSTOP])
    nvme = tempfile.mkdtemp(prefix="nvme-", dir=work)
    cfg_path = os.path.join(work, f"trial{i}.json")
    with open(cfg_path, "w") as f:
        json.dump(config(scenario, args.timeout_s, nvme), f)
    ckpt = os.path.join(nvme, "ckpt")  # checkpoint scenario: beside the (unused) swap directory
    proc = mpirun(args.np, args.zeroshard, cfg_path, extra=["--save", ckpt] if scenario == "checkpoint" else [])
    out = Output(proc)
    result = {"trial": i, "scenario": scenario, "signal": sig.name, "np": args.np}
    try:
        # The checkpoint scenario waits for its first committed save, so a complete one always exists.
        if not wait_for_start(out, proc, r"checkpoint: saved step 1 " if scenario == "checkpoint" else r"step 1/", args, result):
            return result
        time.sleep(rng.uniform(0.0, args.max_delay_s))
        ranks = rank_pids(proc.pid)
        if len(ranks) != args.np:
            result.update(outcome=f"found {len(ranks)} of {args.np} ranks", passed=False)
            return result
        victim = rng.randrange(args.np)
        result["rank"] = victim
        os.kill(ranks[victim], sig)
        t0 = time.monotonic()
        limit = args.timeout_s + 30
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            pass
        # Every rank gone too (mpirun could exit first and leave a rank behind).
        while time.monotonic() - t0 < limit and any(os.path.exists(f"/proc/{p}") and not zombie(p) for p in ranks.values()):
            time.sleep(0.1)
        elapsed = time.monotonic() - t0
        alive = [r for r, p in ranks.items() if os.path.exists(f"/proc/{p}") and not zombie(p)]
        out.thread.join(5)
        text = out.text
        if sig == signal.SIGKILL:
            # mpirun names the killed rank, unless a survivor got there first: its shared-memory
            # collective found the peer gone and ended the job naming the collective and group.
            named = re.search(rf"rank {victim} with PID \d+ .*exited on signal 9", text, re.S) is not None or \
                re.search(PEER_GONE, text) is not None
        else:
            pattern = {"tp": TP_COLLECTIVE, "pp": PP_OP}.get(scenario, COLLECTIVE)
            named = re.search(pattern, text, re.S) is not None
        hung = proc.poll() is None or alive != []
        loads = True
        if scenario == "checkpoint" and not hung:
            loads = checkpoint_loads(args.zeroshard, ckpt, result)
        failed = [line for line in text.splitlines() if re.search(r"error:|fatal:|exited on signal", line)]
        result.update(exit=proc.returncode, seconds=round(elapsed, 1), named=named, message=failed[0][:300] if failed else "",
                      outcome="hang" if hung else "exited",
                      passed=not hung and named and loads and proc.returncode != 0)
        if not result["passed"]:
            result["output_tail"] = text[-3000:]
        return result
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in rank_pids_safe(proc.pid):
            kill_quiet(p)
        shutil.rmtree(nvme, ignore_errors=True)


def checkpoint_loads(zeroshard, root, result):
    """The last complete checkpoint under `root` loads whole and no partial tag is visible; notes in
    `result` which tag that is and whether a save's staging directory was left (the signal landed
    inside a save)."""
    entries = os.listdir(root) if os.path.isdir(root) else []
    result["staging_left"] = any(e.startswith(".staging.") for e in entries)
    partial = [e for e in entries if not e.startswith(".staging.") and e != "latest"
               and not os.path.exists(os.path.join(root, e, "zs_metadata.h5"))]
    try:
        with open(os.path.join(root, "latest")) as f:
            latest = f.read().strip()
    except OSError:
        latest = None
    result["latest"] = latest
    if partial:
        result["load_error"] = f"partial tag(s) visible: {partial}"
        return False
    if latest is None:
        return True  # killed before the first save committed: nothing to load
    r = subprocess.run([zeroshard, "checkpoint", "compare", root, os.path.join(root, latest), "--rtol", "0"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        result["load_error"] = r.stdout.strip()[-500:]
        return False
    return True


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def rank_pids_safe_map(root):
    try:
        return rank_pids(root)
    except OSError:
        return {}


def rank_pids_safe(root):
    return list(rank_pids_safe_map(root).values())


def kill_quiet(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


STORAGE = [
    # (name, mount options or None for a plain tmpfs, expected exit 0?, regex the output must match)
    ("read-only", "size=64m,ro", False, r"nvme_path '[^']*/mnt'.*(read-only|not writable|cannot write)"),
    ("too small", "size=64k", False, r"'[^']*/mnt'.*\d+ bytes"),
    ("tmpfs", "size=256m", True, r"done: final loss"),
]


def storage_trial(name, options, expect_ok, regex, args, work):
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    cfg = config("nvme", args.timeout_s, mnt, steps=3)
    cfg_path = os.path.join(work, f"storage-{name.replace(' ', '-')}.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    script = (f"mount -t tmpfs -o {options} zs-fault {mnt} && exec mpirun --oversubscribe -np {args.np} "
              f"{args.zeroshard} train --config {cfg_path}")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OPENBLAS_NUM_THREADS="1")
    t0 = time.monotonic()
    try:
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout_s + 120)
        text, code = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        text, code = (e.stdout or ""), None
    ok = code is not None and (code == 0) == expect_ok and re.search(regex, text, re.S) is not None
    errors = [line for line in text.splitlines() if "error:" in line or "fatal:" in line]
    r = {"storage": name, "exit": code, "seconds": round(time.monotonic() - t0, 1), "passed": ok,
         "message": errors[0] if errors else ""}
    if not ok:
        r["output_tail"] = text[-3000:]
    return r


def can_mount():
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               "mount -t tmpfs -o size=1m zs-probe /mnt"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=3.0, help="comm.timeout_s of the jobs")
    ap.add_argument("--max-delay-s", type=float, default=2.0, help="the signal comes up to this long after step 1")
    ap.add_argument("--slow-start-s", type=float, default=120.0,
                    help="a job that reaches step 1 later than this counts as a slow start (reported apart)")
    ap.add_argument("--start-limit-s", type=float, default=600.0,
                    help="a job that has not reached step 1 after this long fails its trial (start-up hang)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cycle", action="store_true", help="scenarios in turn instead of at random")
    ap.add_argument("--storage", action="store_true", help="also the storage trials")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset of " + ",".join(SCENARIOS))
    ap.add_argument("--json", help="write every trial's result here")
    args = ap.parse_args()
    unknown = [x for x in args.scenarios.split(",") if x not in SCENARIOS]
    if unknown:
        ap.error(f"--scenarios: unknown {unknown}; choose from {SCENARIOS}")
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="zs-faults-")
    # A private copy of the binary: a relink of the build's zeroshard during the trials (once the
    # likely cause of a job that never reached step 1) cannot touch the jobs this script starts.
    private = os.path.join(work, "zeroshard")
    shutil.copy2(args.zeroshard, private)
    args.zeroshard = private
    results = []
    try:
        for i in range(args.trials):
            r = rank_trial(i, rng, args, work)
            results.append(r)
            ckpt = ""
            if r["scenario"] == "checkpoint" and "latest" in r:
                ckpt = (f", latest {r['latest']} {'does not load: ' + r['load_error'] if 'load_error' in r else 'loads'}"
                        f"{' (inside a save)' if r.get('staging_left') else ''}")
            slow = f" (slow start: at {args.slow_start_s:.0f} s {json.dumps(r['slow_start'])})" if "slow_start" in r else ""
            print(f"trial {i}: {r['scenario']} {r['signal']} rank {r.get('rank', '-')}: started in {r.get('start_s')} s"
                  f"{slow}, {r['outcome']} in {r.get('seconds', '-')} s, exit {r.get('exit')}, named {r.get('named')}{ckpt}: "
                  f"{'ok' if r['passed'] else 'FAILED'}", flush=True)
            if not r["passed"]:
                for key in ("at_limit", "backtraces", "output_tail"):
                    if key in r:
                        print(r[key] if isinstance(r[key], str) else f"{key}: {json.dumps(r[key])}", flush=True)
        if args.storage:
            if can_mount():
                for name, options, expect_ok, regex in STORAGE:
                    r = storage_trial(name, options, expect_ok, regex, args, work)
                    results.append(r)
                    print(f"storage {name}: exit {r['exit']} in {r['seconds']} s: {'ok' if r['passed'] else 'FAILED'}"
                          f"{': ' + r['message'] if r['message'] else ''}", flush=True)
                    if not r["passed"]:
                        print(r.get("output_tail", ""), flush=True)
            else:
                print("storage trials skipped: cannot mount in a private mount namespace here", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rank = [r for r in results if "trial" in r]
    starts = sorted(r["start_s"] for r in rank if "start_s" in r)
    summary = {"trials": len(rank), "passed": sum(r["passed"] for r in rank),
               "hangs": sum(r.get("outcome") == "hang" for r in rank),
               "not_started": sum(r.get("outcome") in ("did not start", "exited before step 1") for r in rank),
               "slow_starts": sum("slow_start" in r for r in rank),
               "start_s": {"median": starts[len(starts) // 2], "max": starts[-1]} if starts else {},
               "max_seconds": max((r.get("seconds", 0) or 0 for r in rank), default=0),
               "limit_seconds": args.timeout_s + 30,
               "checkpoint_loads": sum(r.get("scenario") == "checkpoint" and "latest" in r and "load_error" not in r
                                       for r in rank),
               "checkpoint_signals_inside_a_save": sum(bool(r.get("staging_left")) for r in rank),
               "by": {}}
    for r in rank:
        key = f"{r['scenario']} {r['signal']}"
        b = summary["by"].setdefault(key, {"trials": 0, "passed": 0, "hangs": 0, "seconds": []})
        b["trials"] += 1
        b["passed"] += int(r["passed"])
        b["hangs"] += int(r.get("outcome") == "hang")
        if "seconds" in r:
            b["seconds"].append(r["seconds"])
    for b in summary["by"].values():  # exit time after the signal: min, median, max
        t = sorted(b.pop("seconds"))
        b["seconds"] = [t[0], t[len(t) // 2], t[-1]] if t else []
    print("summary: " + json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "results": results, "args": vars(args)}, f, indent=1)
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
