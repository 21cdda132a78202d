#!/usr/bin/env bash
# Several hosts on one machine, for real (docs/multihost.md): each "host" is a network namespace with
# its own UTS namespace (hostname), joined to the others through veth pairs on a bridge in a switch
# namespace, optionally shaped with tc on every host's link (netem's rate, or tbf's where the kernel
# has no netem). With --delay the hosts are joined instead through the delay line (delay_line.cpp,
# built with the tests: a TUN device in every host, each packet handed to its destination host after
# the delay), whose devices the rate shapes alike. One OpenMPI job
# runs across them: mpirun starts inside the first host, and its rsh agent (this script, as
# `hosts.sh --agent`) starts the daemon of every other host inside that host's namespace. OpenMPI then
# sees H hosts (MPI_COMM_TYPE_SHARED splits by host, so comm's node-aware paths follow the real
# layout) joined only by TCP over the namespaces' subnet; nothing else is reachable from them, and no
# traffic leaves them. Everything made is removed on exit, also after a failure or a signal.
#
#   hosts.sh [--hosts H] [--slots R] [--rate 1gbit] [--burst BYTES] [--delay 100us|1ms] [--mtu 1500]
#            [--cpus-per-host C] [--delay-line PATH] [--stats FILE] -- MPIRUN_ARGS...
#
# runs `mpirun --hostfile (H hosts x R slots) MPIRUN_ARGS...` and exits with its status. --stats writes
# the bytes each host sent through its link (the kernel's counters, one line "hN tx_bytes"; with
# --delay the delay line's own counts go to FILE.delay_line). --cpus-per-host C gives host h CPUs
# h x C .. h x C + C - 1 of this machine (taskset on its mpirun or daemon, inherited by its ranks), so
# each host has cores of its own, as real hosts do; without it every host shares all of them.
# --delay-line (or $ZS_DELAY_LINE) names the delay line's executable, else build/release/tests/multihost/delay_line. --mtu sets every host
# link's MTU (1500 by default). --burst sets tbf's bucket (bytes a host may send at the veth's speed after
# a pause; by default 10 ms of the rate, at least 64 KiB): a real NIC has none above its line rate, and at
# 100 Mbit/s the default lets a collective alone send its first 125 KB at once (tbf only: netem has
# no bucket; docs/scaling.md, "What slows the in-step link at 100 Mbit/s, and what the link's burst
# hides"). Needs root (ip netns); without it exits 77 saying so (ctest's skip code).
set -euo pipefail

if [[ "${1:-}" == --agent ]]; then
  # OpenMPI's rsh agent: `hosts.sh --agent [options] HOST COMMAND...`, as ssh would be called. The
  # command is a shell command line (ssh hands it to the remote shell), run in HOST's namespaces.
  shift
  while [[ "${1:-}" == -* ]]; do shift; done
  host="$1"
  shift
  ns="${ZS_HOSTS_PREFIX:?}${host}"
  pin=()
  if [[ -n "${ZS_HOSTS_CPUS:-}" ]]; then  # --cpus-per-host: this host's own CPUs
    c="$ZS_HOSTS_CPUS" h="${host#h}"
    pin=(taskset -c "$((h * c))-$((h * c + c - 1))")
  fi
  exec ip netns exec "$ns" "${pin[@]}" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
fi

hosts=2 slots=2 rate="" burst="" delay="" stats="" mtu=1500 cpus_per_host="" delay_line="${ZS_DELAY_LINE:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --slots) slots="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --burst) burst="$2"; shift 2 ;;
    --delay) delay="$2"; shift 2 ;;
    --stats) stats="$2"; shift 2 ;;
    --mtu) mtu="$2"; shift 2 ;;
    --cpus-per-host) cpus_per_host="$2"; shift 2 ;;
    --delay-line) delay_line="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "hosts.sh: unknown option '$1' (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
if [[ "$hosts" -lt 2 || "$hosts" -gt 200 ]]; then
  echo "hosts.sh: --hosts $hosts is out of range (2..200)" >&2
  exit 2
fi
if [[ -n "$cpus_per_host" ]] && ! { [[ "$cpus_per_host" =~ ^[1-9][0-9]*$ ]] && ((hosts * cpus_per_host <= $(nproc))); }; then
  echo "hosts.sh: --cpus-per-host '$cpus_per_host': give a whole number of CPUs per host, at most $(nproc) / $hosts here (this machine has $(nproc) CPUs for $hosts hosts)" >&2
  exit 2
fi
if [[ -n "$burst" ]] && ! { [[ "$burst" =~ ^[1-9][0-9]*$ ]] && ((burst >= 3000)) && [[ -n "$rate" ]]; }; then
  echo "hosts.sh: --burst '$burst': give tbf's bucket in bytes, at least 3000 (two full frames), with --rate" >&2
  exit 2
fi
delay_us=""
if [[ -n "$delay" ]]; then
  case "$delay" in
    *us) delay_us="${delay%us}" ;;
    *ms) delay_us="${delay%ms}000" ;;
    *) delay_us="bad" ;;
  esac
  if ! [[ "$delay_us" =~ ^[0-9]+$ ]]; then
    echo "hosts.sh: --delay '$delay': give an integer with us or ms (100us, 1ms)" >&2
    exit 2
  fi
  : "${delay_line:=$(dirname "$(realpath "$0")")/../../build/release/tests/multihost/delay_line}"
  if [[ ! -x "$delay_line" ]]; then
    echo "hosts.sh: --delay needs the delay line, not found at '$delay_line': build it (cmake --build build/release --target delay_line) or give --delay-line PATH" >&2
    exit 2
  fi
fi
if [[ "$(id -u)" != 0 ]] || ! ip netns add "zs-probe-$$" 2>/dev/null; then
  echo "hosts.sh: network namespaces need root (ip netns add failed): the multi-host runs are skipped here" >&2
  exit 77
fi
ip netns delete "zs-probe-$$"

# What a run killed outright (SIGKILL: no trap runs) left behind: namespaces named after a process that
# no longer exists.
for stale in $(ip netns list | grep -oE '^zs[0-9]+-[a-z0-9]+' || true); do
  pid="${stale#zs}"
  pid="${pid%%-*}"
  if [[ ! -e "/proc/$pid" ]]; then
    ip netns pids "$stale" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns delete "$stale" 2>/dev/null || true
    rm -rf "/etc/netns/$stale"
  fi
done

# Names unique per run, so concurrent runs never meet; the subnet is private to the namespaces.
export ZS_HOSTS_PREFIX="zs$$-"
switch="${ZS_HOSTS_PREFIX}sw"
work="$(mktemp -d "${TMPDIR:-/tmp}/zs-hosts.XXXXXX")"
line_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # The delay line's TUN devices end with it (it also ends if this script is SIGKILLed: PDEATHSIG).
  if [[ -n "$line_pid" ]]; then
    kill -TERM "$line_pid" 2>/dev/null || true
    wait "$line_pid" 2>/dev/null || true
    if [[ -n "$stats" ]]; then cp "$work/delay_line.log" "$stats.delay_line" 2>/dev/null || true; fi
  fi
  # Ranks and daemons still alive in a host's namespace (a failed or killed job) end with it.
  for ((h = 0; h < hosts; ++h)); do
    local ns="${ZS_HOSTS_PREFIX}h$h"
    if ip netns list | grep -q "^$ns\b"; then
      local pids
      pids="$(ip netns pids "$ns" 2>/dev/null || true)"
      [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null || true
      ip netns delete "$ns" 2>/dev/null || true
    fi
    rm -rf "/etc/netns/$ns"
  done
  ip netns delete "$switch" 2>/dev/null || true
  rmdir /etc/netns 2>/dev/null || true  # made by this script if no other run holds it
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

# The link's rate: netem where the kernel has it, else tbf (this machine's kernel has no sch_netem).
# The delay is the delay line's, on every kernel (one way to delay, measured: docs/multihost.md).
shape() {
  if ip netns exec "$1" tc qdisc add dev eth0 root netem rate "$rate" 2>/dev/null; then
    return
  fi
  local n="${rate%%[a-zA-Z]*}" unit="${rate##*[0-9]}" bits
  case "$unit" in
    gbit) bits=$((n * 1000000000)) ;;
    mbit) bits=$((n * 1000000)) ;;
    kbit) bits=$((n * 1000)) ;;
    *) echo "hosts.sh: --rate '$rate': give an integer with gbit, mbit or kbit" >&2; return 2 ;;
  esac
  local bucket=$((bits / 800))  # 10 ms at the rate, so a timer tick's worth always fits
  ((bucket < 65536)) && bucket=65536
  [[ -n "$burst" ]] && bucket="$burst"
  ip netns exec "$1" tc qdisc add dev eth0 root tbf rate "$rate" burst "$bucket" latency 50ms
}

if [[ -z "$delay" ]]; then
  ip netns add "$switch"
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
fi
hostsfile="$work/hosts"
: >"$hostsfile"
for ((h = 0; h < hosts; ++h)); do
  echo "10.213.$((h / 250)).$((h % 250 + 1)) h$h" >>"$hostsfile"
done
for ((h = 0; h < hosts; ++h)); do
  ns="${ZS_HOSTS_PREFIX}h$h"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
done
if [[ -n "$delay" ]]; then
  # Every host's eth0 is a TUN device of the delay line; the devices exist once it writes "ready".
  ends=()
  for ((h = 0; h < hosts; ++h)); do
    ends+=("/run/netns/${ZS_HOSTS_PREFIX}h$h:eth0:$(sed -n "$((h + 1))p" "$hostsfile" | cut -d' ' -f1)")
  done
  "$delay_line" --delay-us "$delay_us" --mtu "$mtu" --ready "$work/ready" "${ends[@]}" 2>"$work/delay_line.log" &
  line_pid=$!
  for ((i = 0; i < 200; ++i)); do  # 10 s
    [[ -e "$work/ready" ]] || ! kill -0 "$line_pid" 2>/dev/null && break
    sleep 0.05
  done
  if [[ ! -e "$work/ready" ]]; then
    echo "hosts.sh: the delay line did not start: $(cat "$work/delay_line.log")" >&2
    exit 1
  fi
fi
for ((h = 0; h < hosts; ++h)); do
  ns="${ZS_HOSTS_PREFIX}h$h"
  if [[ -z "$delay" ]]; then
    ip link add "zs$$h${h}" netns "$ns" type veth peer name "p$h" netns "$switch"
    ip -n "$ns" link set "zs$$h${h}" name eth0
    ip -n "$switch" link set "p$h" master br0
    ip -n "$switch" link set "p$h" mtu "$mtu" up
  fi
  ip -n "$ns" addr add "$(sed -n "$((h + 1))p" "$hostsfile" | cut -d' ' -f1)/16" dev eth0
  ip -n "$ns" link set eth0 mtu "$mtu" up
  if [[ -n "$rate" ]]; then shape "$ns"; fi
  # `ip netns exec` binds /etc/netns/NS/hosts over /etc/hosts: every host resolves the others' names.
  mkdir -p "/etc/netns/$ns"
  { echo "127.0.0.1 localhost"; cat "$hostsfile"; } >"/etc/netns/$ns/hosts"
done
for ((h = 0; h < hosts; ++h)); do echo "h$h slots=$slots"; done >"$work/hostfile"

# The hosts share this machine's cores. OpenMPI polls without yielding in its blocking calls unless
# it sees more ranks than slots, and each host has its own slots, so H x R ranks on fewer cores
# would spin each other (and the kernel's TCP work) off them: a two-host ZeRO-3 step took 1.9-3.5 s
# instead of 0.13-0.15 s on 2 cores (docs/multihost.md). Real hosts have their own cores.
host_mpi_args=()
oversubscribed=$((hosts * slots > $(nproc)))
if [[ -n "$cpus_per_host" ]]; then oversubscribed=$((slots > cpus_per_host)); fi
if ((oversubscribed)); then host_mpi_args=(--mca mpi_yield_when_idle 1); fi
pin0=()
if [[ -n "$cpus_per_host" ]]; then
  export ZS_HOSTS_CPUS="$cpus_per_host"
  pin0=(taskset -c "0-$((cpus_per_host - 1))")
  # OpenMPI binds 1-2 ranks per host to cores of the whole machine's topology (rank 0 of every host
  # to core 0), which would undo the host's own CPUs.
  host_mpi_args+=(--bind-to none)
fi
# In the background, waited for: a signal to this script then runs its trap at once (bash defers traps
# until a foreground child ends), and the trap ends the job with the namespaces.
set +e
ip netns exec "${ZS_HOSTS_PREFIX}h0" "${pin0[@]}" unshare --uts sh -c 'hostname h0 && exec "$@"' sh \
  mpirun --hostfile "$work/hostfile" \
    --mca plm_rsh_agent "$(realpath "$0") --agent" \
    --mca btl tcp,self --mca btl_tcp_if_include 10.213.0.0/16 --mca oob_tcp_if_include 10.213.0.0/16 \
    "${host_mpi_args[@]}" "$@" <&0 &
wait "$!"
rc=$?
set -e
if [[ -n "$stats" ]]; then
  for ((h = 0; h < hosts; ++h)); do
    echo "h$h $(ip netns exec "${ZS_HOSTS_PREFIX}h$h" cat /sys/class/net/eth0/statistics/tx_bytes)"
  done >"$stats"
fi
exit "$rc"
