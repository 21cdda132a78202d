#!/usr/bin/env python3
"""Question (issue 37): what do the links of tests/multihost/hosts.sh give: round-trip time and TCP
throughput between two hosts (network namespaces), over the bridge and through the delay line
(--delay: tests/multihost/delay_line.cpp), and what the delay line costs in CPU?

For every setting, one hosts.sh run of two hosts with one slot each starts this script as both ends
(mpirun -np 2; rank 0 on h0, rank 1 on h1): a UDP ping-pong of 64-byte datagrams (--pings round trips
after 50 warm-up ones; the median, 10th and 90th percentiles; this machine has no `ping` binary), then
one TCP stream of --mbytes MiB from h0 to h1 (Mbit/s from the first byte sent to the receiver's
acknowledgement of the last). The delay line's CPU seconds (user + system, over its whole life) come
from its own report (hosts.sh --stats FILE writes FILE.delay_line).

  python3 benchmarks/link_bench.py --hosts-sh tests/multihost/hosts.sh --json link_bench.json \\
      [--settings bridge,0us,100us,1ms] [--rate 1gbit] [--mtu 1500] [--pings 500] [--mbytes 64]

Timings are the scheduler's share on a loaded machine: report `uptime` (in the JSON) beside them.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

PORT_UDP, PORT_TCP = 47123, 47124
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def connect(addr, port, kind):
    for _ in range(400):
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.connect((addr, port))
            return s
        except OSError:
            s.close()
            time.sleep(0.025)
    raise SystemExit(f"link_bench: cannot reach {addr}:{port}")


def peer(args):
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    h0, h1 = "10.213.0.1", "10.213.0.2"  # hosts.sh's addresses of h0 and h1
    if rank == 1:  # the echo and sink end, on h1
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind((h1, PORT_UDP))
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        t.bind((h1, PORT_TCP))
        t.listen(1)
        while True:
            data, src = u.recvfrom(2048)
            if data == b"end":
                break
            u.sendto(data, src)
        c, _ = t.accept()
        want = args.mbytes << 20
        got = 0
        while got < want:
            chunk = c.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        c.sendall(b"k")
        c.close()
        return
    u = connect(h1, PORT_UDP, socket.SOCK_DGRAM)
    u.settimeout(1.0)  # a ping unanswered for 1 s is lost (a late answer under load is not)
    rtts = []
    lost = 0
    answered = 0
    seq = 0
    while len(rtts) < args.pings:
        seq += 1
        msg = seq.to_bytes(8, "little") * 8  # 64 bytes; a late answer to an earlier ping is skipped
        t0 = time.perf_counter()
        u.send(msg)
        try:
            while u.recv(2048) != msg:
                pass
        except (socket.timeout, ConnectionRefusedError):  # refused: h1's end is not bound yet
            lost += answered > 0
            time.sleep(0.01)
            continue
        answered += 1
        if answered > 50:  # after 50 warm-up round trips
            rtts.append((time.perf_counter() - t0) * 1e6)
    for _ in range(20):
        u.send(b"end")
        time.sleep(0.01)
    c = connect(h1, PORT_TCP, socket.SOCK_STREAM)
    block = b"\0" * (1 << 20)
    t0 = time.perf_counter()
    for _ in range(args.mbytes):
        c.sendall(block)
    c.recv(1)
    secs = time.perf_counter() - t0
    q = statistics.quantiles(rtts, n=10)
    print(json.dumps({"rtt_us_median": statistics.median(rtts), "rtt_us_p10": q[0], "rtt_us_p90": q[-1],
                      "pings": len(rtts), "lost": lost, "tcp_mbit_s": args.mbytes * 8 * 1.048576 / secs,
                      "tcp_seconds": secs}), flush=True)


def drive(args):
    results = []
    for setting in args.settings.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            stats = os.path.join(tmp, "links.txt")
            cmd = [args.hosts_sh, "--hosts", "2", "--slots", "1", "--mtu", str(args.mtu), "--stats", stats]
            if setting != "bridge":
                cmd += ["--delay", setting]
            if args.rate:
                cmd += ["--rate", args.rate]
            cmd += ["--", "-np", "2", sys.executable, os.path.abspath(__file__), "--peer",
                    "--pings", str(args.pings), "--mbytes", str(args.mbytes)]
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV), timeout=300)
            wall = time.monotonic() - t0
            if p.returncode == 77:
                print(p.stderr.strip())
                return 77
            if p.returncode != 0:
                raise SystemExit(f"link_bench: {setting}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
            r = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])
            r.update(setting=setting, rate=args.rate or "none", mtu=args.mtu, hosts_sh_seconds=wall)
            line_log = stats + ".delay_line"
            if os.path.exists(line_log):
                for line in open(line_log):
                    if "cpu_seconds" in line:
                        f = line.split()
                        r["delay_line_cpu_s"] = float(f[2])
                        r["delay_line_wall_s"] = float(f[4])
                    if "dropped" in line:
                        r["delay_line_dropped"] = int(line.split()[1])
            results.append(r)
            print(json.dumps(r), flush=True)
    out = {"uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print("setting | rate | RTT us median (p10-p90) | TCP Mbit/s | delay line CPU s / wall s")
    for r in results:
        cpu = f"{r['delay_line_cpu_s']:.2f} / {r['delay_line_wall_s']:.1f}" if "delay_line_cpu_s" in r else "-"
        print(f"{r['setting']} | {r['rate']} | {r['rtt_us_median']:.0f} ({r['rtt_us_p10']:.0f}-{r['rtt_us_p90']:.0f}) | "
              f"{r['tcp_mbit_s']:.0f} | {cpu}")
    print(out["uptime"])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts-sh", default="tests/multihost/hosts.sh")
    ap.add_argument("--json")
    ap.add_argument("--settings", default="bridge,0us,100us,1ms")
    ap.add_argument("--rate", default="")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--pings", type=int, default=500)
    ap.add_argument("--mbytes", type=int, default=64)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        peer(args)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
