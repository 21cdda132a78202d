#!/usr/bin/env python3
"""Crash-during-save harness: SIGKILLs a saving command at random points and checks that the previous
checkpoint still loads and that `latest` never names a partial tag (docs/checkpoints.md, "Crash test").

  crash_harness.py --zeroshard BIN --workdir DIR [--trials 20] [--seed 1] [--kill group|one|mixed]
                   [--json FILE] -- COMMAND ... {root} ... {tag} ...

The checkpoint root {root} is a fresh directory under --workdir, removed at the end when every trial
passed (kept for a look otherwise). COMMAND saves one checkpoint under {root} with tag {tag} (both
replaced by the harness) and exits 0 once
it is committed: today tests/checkpoint/save_driver.cpp (a coordinator and forked writer processes
through the real storage path); `zeroshard train --save {root} ...` fits the same slot. The
command runs in its own session; a kill is SIGKILL to the whole process group ("group"), or to one
random process of it ("one": a writer or the coordinator, the way one rank dies), after a delay drawn
uniformly from [0, 1.2 x the measured duration of an uninterrupted save]. After each kill the
harness waits for every process of the group to exit (a survivor still running after 60 s is a hang,
a failure), then checks with `zeroshard checkpoint`:
  - `latest` names the tag it named before the trial or the trial's tag;
  - that tag and the one that was latest before the trial load whole (`compare PREV LATEST` reads
    every element of every buffer of both, so every checksum is verified);
  - no directory but staging ones (.staging.*) and complete tags is left behind.
Exit 0 when every trial passes; the JSON says how many kills landed before the commit (latest kept),
after it (latest moved), or after the command had already finished.

Train mode (--train MODE[,MODE...], no COMMAND): a real `mpirun -np NP zeroshard train --save DIR` of a
tiny GPT (ZeRO-3, optimizer states and parameters swapped to NVMe files, a save every --save-interval
steps, --steps steps) is interrupted after a random step (a kill also a random part of a step later),
then resumed with the same command plus `--load DIR` (without it when no checkpoint exists yet).
Passes when the resumed run's losses equal the last --steps - k losses of an uninterrupted run bit for
bit (k the step of the checkpoint it loaded), its final parameter digest equals that run's, and:
  kill        SIGKILL to mpirun and every rank, or to one random rank (mpirun then ends the others),
              before, during or after a save: `latest` names a complete tag (or none exists yet);
  term-all    SIGTERM to every rank (a scheduler's preemption): exit 0 within the bound, the
              checkpoint at the step the run stopped at (its summary's last step), no swap file left;
  term-one    SIGTERM to one random rank only: the same (every rank stops at the same step);
  term-twice  SIGTERM to every rank, again once the first was delivered: exits at once, non-zero,
              `latest` complete, no swap file left;
  term-nosave SIGTERM without --save: exits non-zero at the next step boundary, saying no checkpoint
              dir was configured, no swap file left (no resume).

  crash_harness.py --zeroshard BIN --workdir DIR --train kill --trials 4 --seed 1
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
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "faults"))
from fault_trials import Output, rank_pids, zombie  # noqa: E402  (one way to find a job's ranks)


def run_ok(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def group_pids(pgid):
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        # fields[0] is the state, fields[2] the process group; zombies have exited
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def tag_step(name):
    """The N of a committed tag directory global_stepN, None for anything else."""
    m = re.fullmatch(r"global_step(\d+)", name)
    return int(m.group(1)) if m else None


def read_latest(root):
    try:
        with open(os.path.join(root, "latest")) as f:
            return f.read().strip()
    except OSError:
        return None


TRAIN_MODES = ["kill", "term-all", "term-one", "term-twice", "term-nosave"]


def train_config(a, nvme):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_steps": a.steps,
            "steps_per_print": 1, "device": {"memory_mb": 256}, "comm": {"timeout_s": 10},
            "model": {"n_layer": 2, "d_model": 64, "n_head": 4, "seq_len": 32},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                  "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                                  "offload_param": {"device": "nvme", "nvme_path": nvme}},
            "checkpoint": {"save_interval": a.save_interval}}


def start_train(a, cfg_path, summary, extra=()):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = [a.mpirun, "--oversubscribe", "-np", str(a.np), a.zeroshard, "train", "--config", cfg_path,
           "--summary", summary] + list(extra)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                            start_new_session=True)


def finish(proc, out, limit):
    """Waits up to `limit` s for mpirun and every rank; returns (exit code or None on a hang, output)."""
    ranks = rank_pids(proc.pid)
    deadline = time.monotonic() + limit
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        pass
    while time.monotonic() < deadline and any(not zombie(p) for p in ranks.values()):
        time.sleep(0.01)
    hung = proc.poll() is None or any(not zombie(p) for p in ranks.values())
    if hung:
        os.killpg(proc.pid, signal.SIGKILL)
        for p in ranks.values():
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()
    out.thread.join(5)
    return (None if hung else proc.returncode), out.text


def delivered(pid, sig):
    """True once `sig` is no longer pending for process `pid` (its handler has run, or it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("ShdPnd:", "SigPnd:")) and int(line.split()[1], 16) & (1 << (sig - 1)):
                    return False
    except OSError:
        pass
    return True


def send(pid, sig):
    """os.kill that ignores a process already gone (a negative pid: the process group)."""
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def signal_moment(a, rng, mode, proc, out, step_s):
    """Waits for a random step's log line (and, for a kill, a random part of a step and a save more),
    signals per `mode`; returns what was done, None when the run never logged that step, or
    "finished" when it had ended first. A SIGTERM comes no later than 60% into the run, so it stops
    the run, however fast the run goes against the uninterrupted one."""
    k = rng.randint(1, a.steps if mode == "kill" else max(1, int(0.6 * a.steps)))
    if not out.wait_for(rf"step {k}/{a.steps} ", 120):
        return "finished" if proc.poll() is not None else None
    if mode == "kill":
        time.sleep(rng.uniform(0, min(2 * step_s, 0.5)))
    ranks = rank_pids(proc.pid)
    if len(ranks) != a.np:
        return "finished"
    if mode == "kill":
        if rng.random() < 0.5:
            send(-proc.pid, signal.SIGKILL)
            for p in ranks.values():
                send(p, signal.SIGKILL)
            return "SIGKILL to every process"
        victim = rng.randrange(a.np)
        send(ranks[victim], signal.SIGKILL)
        return f"SIGKILL to rank {victim}"
    if mode == "term-one":
        victim = rng.randrange(a.np)
        send(ranks[victim], signal.SIGTERM)
        return f"SIGTERM to rank {victim}"
    for p in ranks.values():
        send(p, signal.SIGTERM)
    if mode == "term-twice":
        end = time.monotonic() + 5
        while not all(delivered(p, signal.SIGTERM) for p in ranks.values()) and time.monotonic() < end:
            time.sleep(0.0005)
        for p in ranks.values():
            send(p, signal.SIGTERM)
        return "SIGTERM to every rank, twice"
    return "SIGTERM to every rank"


def losses(path):
    try:
        with open(path) as f:
            s = json.load(f)
        return s["loss_history"], s["param_digest"]
    except (OSError, ValueError, KeyError):
        return None, None


def train_trial(a, rng, mode, trial, ref, run_s, work):
    d = tempfile.mkdtemp(prefix=f"{mode}-{trial}-", dir=work)
    nvme, root = os.path.join(d, "nvme"), os.path.join(d, "ckpt")
    os.makedirs(nvme)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(train_config(a, nvme), f)
    save = [] if mode == "term-nosave" else ["--save", root]
    proc = start_train(a, cfg_path, os.path.join(d, "part.json"), save)
    out = Output(proc)
    what = signal_moment(a, rng, mode, proc, out, run_s / a.steps)
    t0 = time.monotonic()
    code, text = finish(proc, out, 60)
    seconds = time.monotonic() - t0
    r = {"mode": mode, "trial": trial, "signal": what, "exit": code, "seconds": round(seconds, 2)}
    problems = []
    if what is None or (what == "finished" and mode != "kill"):
        problems.append(f"not signalled: {what or 'the chosen step not logged within 120 s'}")
    if code is None:
        problems.append("processes still running 60 s after the signal (a hang)")
    latest = read_latest(root)
    staging = [e for e in os.listdir(root) if e.startswith(".staging.")] if os.path.isdir(root) else []
    r.update(latest=latest, staging_left=len(staging))
    swap_left = os.listdir(nvme)
    part, _ = losses(os.path.join(d, "part.json"))
    if mode.startswith("term") and swap_left:
        problems.append(f"swap files left behind: {swap_left}")
    if mode in ("term-all", "term-one"):
        k = len(part or [])
        if code != 0:
            problems.append(f"exit {code}, not 0")
        if not re.search(rf"preempted: SIGTERM at step {k}/{a.steps}: saved checkpoint global_step{k}", text):
            problems.append(f"no 'preempted: ... saved checkpoint global_step{k}' line")
        if latest != f"global_step{k}":
            problems.append(f"latest is {latest}, not the step the run stopped at ({k})")
        if part is not None and part != ref[0][:k]:
            problems.append("the preempted run's losses differ from the uninterrupted run's")
    elif mode == "term-twice":
        if code in (0, None):
            problems.append(f"exit {code}: the second SIGTERM did not end the run at once")
    elif mode == "term-nosave":
        if code in (0, None) or "no checkpoint dir was configured" not in text:
            problems.append(f"exit {code}; wanted non-zero and 'no checkpoint dir was configured'")
    if latest is not None and not os.path.exists(os.path.join(root, latest, "zs_metadata.h5")):
        problems.append(f"latest names {latest}, which is not a complete tag")
    if mode != "term-nosave" and not problems:
        # The same command plus --load (without it when nothing was saved yet).
        load = ["--load", root] if latest else []
        proc = start_train(a, cfg_path, os.path.join(d, "resumed.json"), ["--save", root] + load)
        # A slow run is not a hang: the limit grows with the uninterrupted run's time (a loaded machine).
        code2, text2 = finish(proc, Output(proc), 120 + 4 * run_s)
        k = int(latest[len("global_step"):]) if latest else 0
        got, digest = losses(os.path.join(d, "resumed.json"))
        r.update(resumed_from=k)
        if code2 != 0:
            problems.append(f"the resumed run exited {code2}: {text2[-1500:]}")
        elif latest and f"loaded {root}/{latest} (step {k}," not in text2:
            problems.append("the resumed run has no 'checkpoint: loaded' line for " + latest)
        elif got != ref[0][k:]:
            problems.append(f"resumed from step {k}: losses {got} differ from the uninterrupted run's {ref[0][k:]}")
        elif digest != ref[1]:
            problems.append(f"resumed from step {k}: final digest {digest}, uninterrupted {ref[1]}")
    if problems:
        r["problems"] = problems
        r["output_tail"] = text[-3000:]
    else:
        shutil.rmtree(d, ignore_errors=True)
    return r


def train_main(a):
    modes = a.train.split(",")
    for m in modes:
        if m not in TRAIN_MODES:
            print(f"crash_harness: --train {m}: not one of {', '.join(TRAIN_MODES)}", file=sys.stderr)
            return 2
    rng = random.Random(a.seed)
    os.makedirs(a.workdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="crash-train-", dir=a.workdir)
    private = os.path.join(work, "zeroshard")  # a relink of the build's binary cannot touch the runs
    shutil.copy2(a.zeroshard, private)
    a.zeroshard = private
    # The uninterrupted run every trial ends against; its time from step 1 to the last step bounds the
    # random moment.
    nvme = os.path.join(work, "nvme")
    os.makedirs(nvme)
    cfg_path = os.path.join(work, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(train_config(a, nvme), f)
    proc = start_train(a, cfg_path, os.path.join(work, "full.json"), ["--save", os.path.join(work, "full_ckpt")])
    out = Output(proc)
    out.wait_for(r"step 1/", 120)
    t_step1 = time.monotonic()
    out.wait_for(rf"step {a.steps}/{a.steps}", 300)
    run_s = time.monotonic() - t_step1
    code, text = finish(proc, out, 300)
    ref = losses(os.path.join(work, "full.json"))
    if code != 0 or ref[0] is None or len(ref[0]) != a.steps:
        print(f"crash_harness: the uninterrupted run failed (exit {code}):\n{text[-3000:]}", file=sys.stderr)
        return 1
    results = []
    for mode in modes:
        for trial in range(a.trials):
            r = train_trial(a, rng, mode, trial, ref, run_s, work)
            results.append(r)
            moment = ("during a save" if r.get("staging_left") else f"latest {r.get('latest')}")
            print(f"{mode} trial {trial}: {r['signal']} -> exit {r['exit']} in {r['seconds']} s, {moment}, "
                  f"resumed from step {r.get('resumed_from', '-')}: "
                  + ("ok" if "problems" not in r else "FAIL: " + "; ".join(r["problems"])), flush=True)
            if "problems" in r:
                print(r["output_tail"], flush=True)
    failures = [r for r in results if "problems" in r]
    summary = {"trials": len(results), "passed": len(results) - len(failures), "steps": a.steps, "np": a.np,
               "save_interval": a.save_interval, "uninterrupted_training_s": round(run_s, 2),
               "by_mode": {m: sum(1 for r in results if r["mode"] == m and "problems" not in r) for m in modes},
               "killed_during_save": sum(1 for r in results if r.get("staging_left")),
               "max_exit_seconds": max((r["seconds"] for r in results), default=0)}
    print("crash_harness: " + json.dumps(summary), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "checkpoint_crash_train", "summary": summary, "results": results}, f, indent=1)
    if failures:
        print(f"crash_harness: runs left in {work}", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kill", choices=["group", "one", "mixed"], default="mixed")
    ap.add_argument("--json")
    ap.add_argument("--train", help="train mode: " + ",".join(TRAIN_MODES) + " (comma-separated; --trials each)")
    ap.add_argument("--np", type=int, default=2, help="train mode: ranks")
    ap.add_argument("--mpirun", default="mpirun", help="train mode: the MPI launcher")
    ap.add_argument("--steps", type=int, default=30, help="train mode: the run's total steps")
    ap.add_argument("--save-interval", type=int, default=3, help="train mode: checkpoint.save_interval")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.train:
        return train_main(a)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or not any("{tag}" in c for c in cmd):
        ap.error("give the command after --, with {tag} (and {root}) in it")
    rng = random.Random(a.seed)
    os.makedirs(a.workdir, exist_ok=True)
    a.root = tempfile.mkdtemp(prefix="crash-", dir=a.workdir)

    keep_last = int(cmd[cmd.index("--keep-last") + 1]) if "--keep-last" in cmd else None

    def command(tag):
        return [c.replace("{root}", a.root).replace("{tag}", tag) for c in cmd]

    # Two uninterrupted saves: the first tag every trial falls back to, and the save's duration.
    durations = []
    for step in (1, 2):
        t0 = time.monotonic()
        r = run_ok(command(f"global_step{step}"))
        durations.append(time.monotonic() - t0)
        if r.returncode != 0 or read_latest(a.root) != f"global_step{step}":
            print(f"crash_harness: the uninterrupted save failed (exit {r.returncode}):\n{r.stdout}", file=sys.stderr)
            return 1
    save_s = max(durations)

    outcomes = {"latest_kept": 0, "latest_moved": 0, "finished_before_kill": 0}
    failures = []
    for trial in range(a.trials):
        prev = read_latest(a.root)
        tag = f"global_step{trial + 3}"
        delay = rng.uniform(0, 1.2 * save_s)
        mode = a.kill if a.kill != "mixed" else rng.choice(["group", "one"])
        proc = subprocess.Popen(command(tag), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        time.sleep(delay)
        finished = proc.poll() is not None
        members = group_pids(proc.pid)
        if members:
            if mode == "group":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                os.kill(rng.choice(members), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (proc.poll() is None or group_pids(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        problems = []
        if proc.poll() is None or group_pids(proc.pid):
            problems.append("processes still running 60 s after the kill (a hang)")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        latest = read_latest(a.root)
        if latest not in (prev, tag):
            problems.append(f"latest names {latest!r}, neither the previous tag {prev} nor {tag}")
        else:
            # One compare reads every element of both tags: exit 0 or 1 (equal or not), 2 on an error.
            # Once latest has moved, keep_last may have pruned the previous tag rightly: a kill between
            # a tag's rename and the `latest` update leaves a whole newer tag that `latest` does not
            # name, and pruning counts it. The previous tag may go only when keep_last newer tags stay.
            older = prev
            if latest == tag and not os.path.isdir(os.path.join(a.root, prev)):
                newer = [e for e in os.listdir(a.root) if tag_step(e) is not None and tag_step(e) > tag_step(prev)]
                if keep_last is None or len(newer) < keep_last:
                    problems.append(f"the previous tag {prev} was removed while only {sorted(newer)} are newer "
                                    f"(keep_last {keep_last})")
                older = latest
            r = run_ok([a.zeroshard, "checkpoint", "compare", os.path.join(a.root, older),
                        os.path.join(a.root, latest)])
            if r.returncode not in (0, 1):
                problems.append(f"the previous tag {prev} or latest {latest} does not load: "
                                + (r.stdout.strip().splitlines() or [""])[-1])
        for entry in os.listdir(a.root):
            path = os.path.join(a.root, entry)
            if os.path.isdir(path) and not entry.startswith(".staging.") and \
                    not os.path.exists(os.path.join(path, "zs_metadata.h5")):
                problems.append(f"a partial tag directory {entry} is visible")
        if finished and proc.returncode == 0:
            outcomes["finished_before_kill"] += 1
        elif latest == tag:
            outcomes["latest_moved"] += 1
        else:
            outcomes["latest_kept"] += 1
        line = f"trial {trial:3d}: kill {mode:5s} after {delay * 1e3:7.1f} ms -> latest {latest}"
        print(line + ("" if not problems else "  FAIL: " + "; ".join(problems)), flush=True)
        if problems:
            failures.append({"trial": trial, "delay_s": delay, "mode": mode, "problems": problems})

    print(f"crash_harness: {a.trials} trials, save takes {save_s * 1e3:.0f} ms uninterrupted; "
          f"latest kept {outcomes['latest_kept']}, moved {outcomes['latest_moved']}, "
          f"finished before the kill {outcomes['finished_before_kill']}; {len(failures)} failure(s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "checkpoint_crash", "config": {"trials": a.trials, "seed": a.seed,
                                                                   "kill": a.kill, "command": cmd},
                       "baseline": {"uninterrupted_save_s": save_s},
                       "results": [dict(outcomes, failures=len(failures), failure_details=failures)],
                       "ratio": {"trials_passed": (a.trials - len(failures)) / max(1, a.trials)}}, f, indent=1)
    if failures:
        print(f"crash_harness: checkpoints left in {a.root}", file=sys.stderr)
        return 1
    shutil.rmtree(a.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
