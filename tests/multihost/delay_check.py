#!/usr/bin/env python3
"""hosts.sh --delay through the delay line (tests/multihost/delay_line.cpp; docs/multihost.md "Latency"):

  1. two hosts joined by the delay line at 1 ms one way: a UDP ping-pong (benchmarks/link_bench.py)
     takes at least 2 ms a round trip (the delay is a floor) and under 2 ms + 100 ms, no ping is lost
     (unanswered for 1 s), a TCP stream crosses, and the delay line dropped nothing; afterwards nothing of the run is left (namespaces, /etc/netns entries,
     the delay line's process, whose TUN devices end with it).
  2. a run stopped from outside (SIGTERM to hosts.sh while its job runs): it exits, and again nothing is
     left.

  delay_check.py --hosts-sh tests/multihost/hosts.sh --delay-line build/.../delay_line --link-bench benchmarks/link_bench.py
Exit 0 when every check passed, 77 when this machine cannot make network namespaces (not root).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def leftovers(pid, delay_line):
    left = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if ns.startswith(f"zs{pid}-")]
    left += [d for d in (os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []) if d.startswith(f"zs{pid}-")]
    for p in os.listdir("/proc"):  # the delay line names the namespaces it serves
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if cmd[0] == delay_line.encode() and any(f"/run/netns/zs{pid}-".encode() in c for c in cmd):
            left.append(f"delay_line pid {p}")
    return left


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts-sh", required=True)
    ap.add_argument("--delay-line", required=True)
    ap.add_argument("--link-bench", required=True)
    args = ap.parse_args()
    env = dict(os.environ, ZS_DELAY_LINE=args.delay_line, **MPI_ENV)
    failures = []

    stats = os.path.join(tempfile.mkdtemp(prefix="zs-delay-check."), "links.txt")
    cmd = [args.hosts_sh, "--hosts", "2", "--slots", "1", "--delay", "1ms", "--stats", stats, "--", "-np", "2", sys.executable,
           args.link_bench, "--peer", "--pings", "100", "--mbytes", "8"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out, _ = p.communicate(timeout=240)
    if p.returncode == 77:
        print(out.strip())
        return 77
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        failures.append(f"1 ms: exit {p.returncode}:\n{out[-3000:]}")
    else:
        r = json.loads(lines[-1])
        print(f"1 ms one way: UDP round trip median {r['rtt_us_median']:.0f} us (p10 {r['rtt_us_p10']:.0f}, "
              f"p90 {r['rtt_us_p90']:.0f}), {r['lost']} lost; TCP {r['tcp_mbit_s']:.0f} Mbit/s")
        if not (2000 <= r["rtt_us_p10"] and r["rtt_us_median"] < 102000):
            failures.append(f"1 ms: round trips {r} are not 2 ms + a little")
        if r["lost"] != 0:
            failures.append(f"1 ms: {r['lost']} pings lost (unanswered for 1 s)")
    report = open(stats + ".delay_line").read() if os.path.exists(stats + ".delay_line") else ""
    print(report.strip())
    if " 0 dropped" not in report:
        failures.append(f"1 ms: the delay line dropped packets, or wrote no report: {report!r}")
    left = leftovers(p.pid, args.delay_line)
    if left:
        failures.append(f"1 ms: left behind: {left}")

    p = subprocess.Popen([args.hosts_sh, "--hosts", "2", "--slots", "1", "--delay", "100us", "--", "-np", "2",
                          "sleep", "60"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    time.sleep(4)
    ran = p.poll() is None
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        failures.append("SIGTERM: hosts.sh still ran 30 s later")
        p.kill()
        p.wait()
    left = leftovers(p.pid, args.delay_line)
    print(f"SIGTERM to hosts.sh {'while its job ran' if ran else '(its job had ended)'}: exit {p.returncode}, "
          f"left behind: {left or 'nothing'}")
    if not ran or p.returncode == 0:
        failures.append(f"SIGTERM: the job had ended before the signal, or hosts.sh exited 0:\n{p.stdout.read()[-2000:]}")
    if left:
        failures.append(f"SIGTERM: left behind: {left}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
