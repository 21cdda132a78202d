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
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time


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


def read_latest(root):
    try:
        with open(os.path.join(root, "latest")) as f:
            return f.read().strip()
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kill", choices=["group", "one", "mixed"], default="mixed")
    ap.add_argument("--json")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or not any("{tag}" in c for c in cmd):
        ap.error("give the command after --, with {tag} (and {root}) in it")
    rng = random.Random(a.seed)
    os.makedirs(a.workdir, exist_ok=True)
    a.root = tempfile.mkdtemp(prefix="crash-", dir=a.workdir)

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
            r = run_ok([a.zeroshard, "checkpoint", "compare", os.path.join(a.root, prev),
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
