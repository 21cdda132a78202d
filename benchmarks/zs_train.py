"""One `zeroshard train` run under mpirun for the benchmark scripts (onebit_quality.py, zeropp_quality.py,
zeropp_hosts_bench.py): writes the config, runs it, exits naming the run and the output's tail if it fails,
returns the summary. `launcher`: what runs mpirun's arguments instead of mpirun itself (tests/multihost/hosts.sh
and its options up to "--": the job on several hosts)."""
import json
import os
import subprocess
import sys


def train_summary(zeroshard, np, cfg, tmp, name, launcher=None):
    path = os.path.join(tmp, name + ".json")
    summary = os.path.join(tmp, name + ".summary.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    cmd = (launcher or ["mpirun"]) + ["--allow-run-as-root", "--oversubscribe", "-np", str(np), zeroshard, "train",
           "--config", path, "--summary", summary]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"{name}: zeroshard exited {r.returncode}:\n{r.stdout[-3000:]}")
    with open(summary) as f:
        return json.load(f)
