#!/usr/bin/env python3
"""Long run without leaks (docs/reliability.md, "Long runs"): `zeroshard train` of a tiny GPT at np
ranks for many steps, saving a checkpoint every --save-interval steps, while the host RSS of every rank
(VmRSS in /proc/<pid>/status) and rank 0's device arena reserved bytes (the memory_breakdown log line)
are sampled every --sample-every steps.

Passes when the job exits 0 and, after the warm-up (--warmup-steps), neither grows: the largest RSS of
each rank in the last quarter of the run is at most --rss-tolerance-mib above its largest in the first
quarter after warm-up, and the arena's reserved bytes never rise above their value at the end of the
warm-up. A leak of 200 bytes a step shows as 3 MiB over 16,000 steps.

  long_run.py --zeroshard build/release/tools/zeroshard --steps 20000 --save-interval 1000 --json out.json
Exit 0 when the run passed.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_trials import rank_pids  # noqa: E402  (one way to find a job's ranks)

SAMPLE = re.compile(r"step (\d+) memory \(MiB.*device arena reserved (\d+) bytes")


def vm_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def config(args, ckpt_dir):
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "train_steps": args.steps,
        "steps_per_print": args.sample_every,
        "memory_breakdown": True,
        "device": {"memory_mb": 256},
        "model": {"n_layer": 2, "d_model": 64, "n_head": 4, "seq_len": 32},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": args.stage},
        "checkpoint": {"dir": ckpt_dir, "save_interval": args.save_interval, "keep_last": 2, "async": args.async_save},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroshard", required=True)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--save-interval", type=int, default=1000)
    ap.add_argument("--sample-every", type=int, default=250)
    ap.add_argument("--warmup-steps", type=int, default=2000)
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--async-save", action="store_true", help="checkpoint.async")
    ap.add_argument("--rss-tolerance-mib", type=float, default=2.0)
    ap.add_argument("--json", help="write the samples and the verdict here")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="zs-long-run-")
    cfg_path = os.path.join(work, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(config(args, os.path.join(work, "ckpt")), f)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = ["mpirun", "--oversubscribe", "-np", str(args.np), args.zeroshard, "train", "--config", cfg_path]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    samples, tail, ranks = [], [], {}
    for line in proc.stdout:
        tail = (tail + [line])[-40:]
        m = SAMPLE.search(line)
        if not m:
            continue
        if len(ranks) < args.np:
            ranks = rank_pids(proc.pid)
        rss = {r: vm_rss_kib(pid) for r, pid in sorted(ranks.items())}
        samples.append({"step": int(m.group(1)), "reserved_bytes": int(m.group(2)), "rss_kib": rss,
                        "elapsed_s": round(time.monotonic() - start, 1)})
    rc = proc.wait()
    wall = time.monotonic() - start

    after = [s for s in samples if s["step"] >= args.warmup_steps and len(s["rss_kib"]) == args.np
             and all(s["rss_kib"].values())]
    verdict = {"exit": rc, "wall_s": round(wall, 1), "samples": len(samples)}
    passed = rc == 0 and len(after) >= 8
    if len(after) >= 8:
        q = len(after) // 4
        first, last = after[:q], after[-q:]
        growth = {}
        for r in range(args.np):
            a = max(s["rss_kib"][r] for s in first)
            b = max(s["rss_kib"][r] for s in last)
            growth[r] = b - a
            passed &= b - a <= args.rss_tolerance_mib * 1024
        base = after[0]["reserved_bytes"]
        top = max(s["reserved_bytes"] for s in after)
        passed &= top <= base
        verdict.update(rss_growth_kib=growth, reserved_at_warmup=base, reserved_max_after=top,
                       reserved_min_after=min(s["reserved_bytes"] for s in after),
                       checkpoints=sorted(os.listdir(os.path.join(work, "ckpt"))))
    verdict["passed"] = bool(passed)

    print(f"{'step':>7} {'reserved bytes':>15} " + " ".join(f"{'rss r' + str(r) + ' KiB':>12}" for r in range(args.np)))
    for s in samples:
        if s["step"] % args.save_interval == 0 or s["step"] in (1, args.steps):
            print(f"{s['step']:>7} {s['reserved_bytes']:>15} " +
                  " ".join(f"{s['rss_kib'].get(r) or 0:>12}" for r in range(args.np)))
    print("long_run:", json.dumps(verdict))
    if rc != 0:
        sys.stdout.write("".join(tail))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "verdict": verdict, "samples": samples}, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
