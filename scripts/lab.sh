#!/usr/bin/env bash
# A multi-host lab on this machine, for the tests marked `lab` and for trying network faults by
# hand. Each host is a set of namespaces: its own network stack (ip netns), host name (UTS),
# process ids (PID, with its own /proc), /etc/hosts and boot id (mount). Every host's eth0 is a
# veth into one bridge (198.18.0.0/24, the benchmarking range: nothing leaves this machine); eth1
# is a veth into a bridge of its own (198.19.0.0/24), up and addressed but reaching no peer.
#
#   scripts/lab.sh up [N]          build N hosts h1..hN (default 2); idempotent (`make lab`)
#   scripts/lab.sh down            kill everything running on them, remove them (`make lab-stop`)
#   scripts/lab.sh status          print the hosts; exit 1 when the lab is not up
#   scripts/lab.sh exec [--hosts FILE] HOST CMD…
#                                  run CMD on HOST (in its namespaces, in this directory); with
#                                  --hosts, CMD alone sees FILE as /etc/hosts
#   scripts/lab.sh fw HOST RULE…   an iptables rule on HOST, e.g. fw h1 -A INPUT -p tcp --dport 29500 -j DROP
#   scripts/lab.sh fw-clear HOST   remove every rule added on HOST
#   scripts/lab.sh mtu HOST DEV MTU  set an interface's MTU (the bridge side stays at 1500)
#   scripts/lab.sh slurm           a Slurm of the lab's own on its hosts (`make lab-cluster`);
#                                  `down` stops it with the hosts
#   scripts/lab.sh ray             a Ray cluster on the hosts: head on h1, a node on each other
#                                  host (`make lab-ray`); idempotent
#   scripts/lab.sh ray-stop        stop it (`make lab-ray-stop`); idempotent
#
# Needs root and iptables (Debian's package: apt-get install -y iptables). The kernel here has no
# netem, so delay and loss cannot be produced; refusals, silence (DROP), wrong names, wrong
# interfaces and MTU black holes can.
set -euo pipefail

STATE=/run/ddplab
PREFIX=ddplab
SWITCH=$PREFIX-sw
NET0=198.18.0
NET1=198.19.0
# The first process of each host: pid 1 of its PID namespace, reaping orphans like an init.
REAPER='import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)'

# Exit 0 when the address answers a TCP connect (a refusal is an answer: the host is there).
REACHES='import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=3)
except ConnectionRefusedError:
    pass
except OSError as exc:
    sys.exit(f"{sys.argv[1]}: {exc}")'

log() { echo "lab: $*"; }
die() { echo "lab: error: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "needs root (network namespaces, bridges, iptables)"; }

iptables_cmd() {
  if command -v iptables-legacy >/dev/null; then echo iptables-legacy
  elif command -v iptables >/dev/null; then echo iptables
  else
    log "installing iptables (Debian package)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null; }
    echo iptables-legacy
  fi
}

host_pid() {  # the pid (seen from here) of HOST's first process, or nothing
  local pid
  pid=$(cat "$STATE/$1.pid" 2>/dev/null) || return 0
  if [ -d "/proc/$pid" ] && ip netns identify "$pid" 2>/dev/null | grep -qx "$PREFIX-$1"; then
    echo "$pid"
  fi
}

hosts() { cat "$STATE/hosts" 2>/dev/null || true; }

ns_up() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

build_switch() {
  ns_up "$SWITCH" || ip netns add "$SWITCH"
  ip -n "$SWITCH" link set lo up
  if ! ip -n "$SWITCH" link show br0 >/dev/null 2>&1; then
    ip -n "$SWITCH" link add br0 type bridge
  fi
  ip -n "$SWITCH" link set br0 up
}

build_host() {  # build_host INDEX NHOSTS
  local i=$1 n=$2 name="h$1" ns="$PREFIX-h$1"
  ns_up "$ns" || ip netns add "$ns"
  ip -n "$ns" link set lo up
  local nic br
  for nic in 0 1; do
    if ! ip -n "$ns" link show "eth$nic" >/dev/null 2>&1; then
      ip link add "lab$i-$nic" netns "$SWITCH" type veth peer name "eth$nic" netns "$ns"
    fi
    if [ "$nic" = 0 ]; then br=br0; else br="br1-$i"; fi
    if ! ip -n "$SWITCH" link show "$br" >/dev/null 2>&1; then
      ip -n "$SWITCH" link add "$br" type bridge
    fi
    ip -n "$SWITCH" link set "lab$i-$nic" master "$br"
    ip -n "$SWITCH" link set "$br" up
    ip -n "$SWITCH" link set "lab$i-$nic" up
    local net=$NET0
    [ "$nic" = 1 ] && net=$NET1
    ip -n "$ns" addr replace "$net.$((10 + i))/24" dev "eth$nic"
    ip -n "$ns" link set "eth$nic" up
  done
  mkdir -p "/etc/netns/$ns"
  {
    echo "127.0.0.1 localhost"
    local j
    for j in $(seq 1 "$n"); do echo "$NET0.$((10 + j)) h$j"; done
  } > "/etc/netns/$ns/hosts"
  # No name server answers inside the lab: a name missing from /etc/hosts fails at once.
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' > "/etc/netns/$ns/resolv.conf"
  if [ -z "$(host_pid "$name")" ]; then
    mkdir -p "$STATE"
    cat /proc/sys/kernel/random/uuid > "$STATE/$name.boot_id"
    # ip netns exec gives the host its network and its /etc/hosts; unshare its name, pids, /proc.
    setsid ip netns exec "$ns" unshare --uts --pid --fork --mount-proc -- sh -c \
      "hostname $name && mount --bind $STATE/$name.boot_id /proc/sys/kernel/random/boot_id \
       && exec python3 -c '$REAPER'" </dev/null >"$STATE/$name.log" 2>&1 &
    local outer=$! child="" k
    for k in $(seq 1 50); do
      child=$(cat "/proc/$outer/task/$outer/children" 2>/dev/null | awk '{print $1}')
      [ -n "$child" ] && [ "$(readlink "/proc/$child/ns/uts")" != "$(readlink /proc/self/ns/uts)" ] \
        && [ "$(cat "/proc/$child/comm" 2>/dev/null)" = python3 ] && break
      child=""
      sleep 0.1
    done
    [ -n "$child" ] || die "host $name did not start: $(cat "$STATE/$name.log")"
    echo "$child" > "$STATE/$name.pid"
    # The pids an earlier host of this name wrote belong to a PID namespace that is gone.
    rm -f "$STATE/slurm/slurmd-$name.pid"
    if [ "$name" = h1 ]; then rm -f "$STATE/slurm/slurmctld.pid"; fi
  fi
}

cmd_up() {
  need_root
  local n=${1:-${LAB_HOSTS:-2}}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "N must be 1..200, not '$n'"
  local current
  current=$(hosts | wc -l)
  if [ "$current" -gt 0 ] && [ "$current" -ne "$n" ]; then
    log "the lab has $current hosts; rebuilding it with $n"
    cmd_down
  fi
  local tool
  for tool in ip nsenter unshare python3; do
    command -v "$tool" >/dev/null || die "$tool is missing (Debian: iproute2, util-linux, python3)"
  done
  iptables_cmd >/dev/null
  mkdir -p "$STATE"
  build_switch
  local i
  for i in $(seq 1 "$n"); do build_host "$i" "$n"; done
  seq 1 "$n" | sed 's/^/h/' > "$STATE/hosts"
  # Each host reaches every other one on eth0 (a lab that cannot is not up).
  local last="h$n"
  if [ "$n" -gt 1 ]; then
    run_on h1 python3 -c "$REACHES" "$NET0.$((10 + n))" || die "h1 cannot reach $last on eth0"
  fi
  cmd_status
}

nsenter_cmd() {  # nsenter_cmd HOST: sets NSENTER, the command prefix that enters HOST
  local pid
  pid=$(host_pid "$1")
  [ -n "$pid" ] || die "no host '$1' in the lab (make lab; scripts/lab.sh status)"
  NSENTER=(nsenter -t "$pid" -n -u -m -p "--wd=$PWD" --)
}

run_on() {  # run_on HOST CMD...
  local host=$1
  shift
  nsenter_cmd "$host"
  "${NSENTER[@]}" "$@"
}

cmd_exec() {
  need_root
  local hosts_file=""
  if [ "${1:-}" = --hosts ]; then
    hosts_file=$(realpath "${2:?usage: lab.sh exec --hosts FILE HOST CMD...}")
    shift 2
  fi
  [ $# -ge 2 ] || die "usage: lab.sh exec [--hosts FILE] HOST CMD..."
  local host=$1
  shift
  nsenter_cmd "$host"
  if [ -n "$hosts_file" ]; then  # this command alone sees FILE as /etc/hosts
    exec "${NSENTER[@]}" unshare --mount -- sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' \
      "$hosts_file" "$@"
  fi
  exec "${NSENTER[@]}" "$@"
}

cmd_fw() {
  need_root
  [ $# -ge 2 ] || die "usage: lab.sh fw HOST RULE..."
  local host=$1
  shift
  ns_up "$PREFIX-$host" || die "no host '$host' in the lab"
  ip netns exec "$PREFIX-$host" "$(iptables_cmd)" -w "$@"
}

cmd_fw_clear() {
  need_root
  local host=$1 ipt
  ipt=$(iptables_cmd)
  ns_up "$PREFIX-$host" || die "no host '$host' in the lab"
  ip netns exec "$PREFIX-$host" "$ipt" -w -F
  ip netns exec "$PREFIX-$host" "$ipt" -w -P INPUT ACCEPT
  ip netns exec "$PREFIX-$host" "$ipt" -w -P OUTPUT ACCEPT
}

cmd_mtu() {  # the MTU of HOST's DEV; the switch side keeps 1500, as a switch without jumbo frames
  need_root
  [ $# -eq 3 ] || die "usage: lab.sh mtu HOST DEV MTU"
  ns_up "$PREFIX-$1" || die "no host '$1' in the lab"
  ip -n "$PREFIX-$1" link set "$2" mtu "$3"
}

# -- a Slurm cluster on the lab's hosts (`make lab-cluster`) -----------------------------------
# Its own slurmctld (on h1) and one slurmd per host, with their own config, ports and state
# under $STATE/slurm: the machine's own Slurm (scripts/cluster.sh) is left alone. Use it with
#   SLURM_CONF=/run/ddplab/slurm/slurm.conf scripts/lab.sh exec h1 srun -N 2 CMD...
SLURM_DIR=$STATE/slurm

slurm_conf() {
  local n=$1 cpus j
  cpus=$(nproc)
  cat <<CONF
# written by scripts/lab.sh: the lab's hosts, root daemons (a test cluster only)
ClusterName=ddplab
SlurmctldHost=h1($NET0.11)
SlurmctldPort=6917
SlurmdPort=6918
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SchedulerType=sched/backfill
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool-%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=5
InactiveLimit=0
MinJobAge=60
CONF
  for j in $(seq 1 "$n"); do echo "NodeName=h$j NodeAddr=$NET0.$((10 + j)) CPUs=$cpus State=UNKNOWN"; done
  echo "PartitionName=lab Nodes=h[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
}

slurm_idle() {  # every lab host is an idle (or busy) Slurm node
  local want states
  want=$(hosts | wc -l)
  # sinfo waits about 10 s for a controller that is not there: bounded, so that the wait below
  # stays about 30 s whatever happens.
  states=$(SLURM_CONF=$SLURM_DIR/slurm.conf run_on h1 timeout 3 sinfo -h -N -o '%T' 2>/dev/null \
    | grep -cE '^(idle|mixed|allocated)' || true)
  [ "$states" = "$want" ]
}

cgroups_here() {  # the machine's cgroup mounts, for slurmd inside a host (ip netns remounts /sys)
  awk '$3 == "cgroup" { n = split($4, o, ","); k = "";
         for (i = 1; i <= n; i++) if (o[i] != "rw" && o[i] != "relatime") k = k (k ? "," : "") o[i];
         print $2, k }
       $3 == "cgroup2" { print $2, "cgroup2" }' /proc/mounts
}

mount_cgroups() {  # mount_cgroups HOST: the same cgroup hierarchies in HOST's mount namespace
  local list
  list=$(cgroups_here)
  # shellcheck disable=SC2016
  run_on "$1" sh -c 'mountpoint -q /sys/fs/cgroup && exit 0
    mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
    printf "%s\n" "$0" | while read -r dir opts; do
      [ -n "$dir" ] || continue
      mkdir -p "$dir"
      if [ "$opts" = cgroup2 ]; then mount -t cgroup2 none "$dir"
      else mount -t cgroup -o "$opts" cgroup "$dir"; fi
    done' "$list"
}

daemon_up() {  # daemon_up HOST NAME: NAME's pid file names a live slurm daemon on HOST (its own pids)
  # A pid file left by an earlier lab (a host's pid namespace starts again at 1) may name any
  # process now, even this check's own shell, or a thread of the new slurmctld (/proc/TID
  # answers for threads too, under the daemon's name): only a process (its own thread-group
  # leader) running the daemon the file is for counts.
  local want=slurmd
  [ "$2" = slurmctld ] && want=slurmctld
  [ -s "$SLURM_DIR/$2.pid" ] && run_on "$1" sh -c \
    'pid=$(cat "$0") && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] \
      && grep -q "^Tgid:[[:space:]]*$pid\$" "/proc/$pid/status" \
      && ! grep -q "^State:[[:space:]]*Z" "/proc/$pid/status"' \
    "$SLURM_DIR/$2.pid" "$want" 2>/dev/null
}

stop_daemon() {  # stop_daemon HOST NAME: end the slurm daemon NAME's pid file names, if it runs
  daemon_up "$1" "$2" || return 0
  # A slurmd still retrying its registration ignores SIGTERM: SIGKILL after 3 s.
  run_on "$1" sh -c 'pid=$(cat "$0"); kill "$pid"; for _ in $(seq 1 30); do
      [ -e "/proc/$pid" ] || exit 0; sleep 0.1; done; kill -9 "$pid"; sleep 0.2' \
    "$SLURM_DIR/$2.pid" 2>/dev/null || true
}

daemons_up() {  # daemons_up HOST...: slurmctld on h1 and a slurmd on each HOST are running
  daemon_up h1 slurmctld || return 1
  local host
  for host in "$@"; do daemon_up "$host" "slurmd-$host" || return 1; done
}

cmd_slurm() {
  need_root
  local names n host deadline
  names=$(hosts)
  [ -n "$names" ] || die "the lab is not up (make lab)"
  command -v slurmd >/dev/null && command -v slurmctld >/dev/null \
    || die "Slurm is not installed (make cluster installs slurm-wlm and munge)"
  [ -S /run/munge/munge.socket.2 ] || die "munged is not running (make cluster starts it)"
  if [ -f "$SLURM_DIR/slurm.conf" ] && daemons_up $names && slurm_idle; then
    log "Slurm is up on the lab: SLURM_CONF=$SLURM_DIR/slurm.conf"
    return
  fi
  n=$(echo "$names" | wc -l)
  mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/log"
  slurm_conf "$n" > "$SLURM_DIR/slurm.conf"
  for host in $names; do mount_cgroups "$host"; done
  if ! daemon_up h1 slurmctld; then
    # A slurmd that found no controller retries after minutes: start them again after it.
    for host in $names; do stop_daemon "$host" "slurmd-$host"; done
    run_on h1 slurmctld -f "$SLURM_DIR/slurm.conf"
  fi
  for host in $names; do
    daemon_up "$host" "slurmd-$host" || run_on "$host" slurmd -f "$SLURM_DIR/slurm.conf" -N "$host"
  done
  deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    slurm_idle && { log "Slurm is up on the lab: SLURM_CONF=$SLURM_DIR/slurm.conf"; return; }
    sleep 0.5
  done
  tail -n 5 "$SLURM_DIR/log/slurmctld.log" >&2 2>/dev/null || true
  die "the lab's Slurm nodes did not become idle in 60 s (see $SLURM_DIR/log)"
}

# -- a Ray cluster on the lab's hosts (`make lab-ray`) -----------------------------------------
# `ray start --head` on h1, `ray start --address` on every other host, each with its own temp
# dir under $STATE/ray/<host> (the machine's /tmp/ray, and any local cluster there, are left
# alone), small object stores, a set number of CPUs, no dashboard, and fixed ports: each host
# has its own network stack, so the same ports serve on every host and free ones are checked.
# On every host but h1, $RAY_LOCAL is that host's own directory ($STATE/ray/<host>/local bound
# over it in the mount namespace its Ray runs in): a path whose contents each host has to
# itself, like a node's local disk, for runs whose hosts share no file system.
RAY_DIR=$STATE/ray
RAY_LOCAL=$RAY_DIR/local
RAY_GCS_PORT=6390
RAY_CPUS=${LAB_RAY_CPUS:-2}
RAY_OBJECT_STORE=80000000  # bytes: Ray refuses less than 75 MiB
# GCS, node manager, object manager, metrics, dashboard agent (2), runtime-env agent; workers.
RAY_PORTS="6390 6391 6392 6394 6395 6396 6397"
RAY_WORKER_PORTS="20000 20049"

ray_bin() {
  local bin
  for bin in "${RAY:-}" "$(command -v ray 2>/dev/null || true)" "$PWD/.venv/bin/ray"; do
    [ -n "$bin" ] && [ -x "$bin" ] && { echo "$bin"; return; }
  done
  die "the ray command is not installed (pip install 'ray[train]', or RAY=/path/to/ray)"
}

ray_daemons_up() {  # ray_daemons_up HOST: HOST runs a raylet (and h1 the GCS) of the lab's Ray
  local want=raylet
  run_on "$1" sh -c 'for want in "$@"; do
      found=""
      for c in /proc/[0-9]*/comm; do [ "$(cat "$c" 2>/dev/null)" = "$want" ] && found=1 && break; done
      [ -n "$found" ] || exit 1
    done' sh "$want" $([ "$1" = h1 ] && echo gcs_server) 2>/dev/null
}

ray_port_free() {  # ray_port_free HOST: none of the lab Ray's fixed ports is taken on HOST
  local port busy=""
  for port in $RAY_PORTS; do
    if ip netns exec "$PREFIX-$1" python3 -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))' "$port" 2>/dev/null; then :; else busy="$busy $port"; fi
  done
  [ -z "$busy" ] || die "ports$busy are taken on $1: the lab's Ray needs them (scripts/lab.sh ray-stop?)"
}

ray_start_on() {  # ray_start_on HOST: the head on h1, a node joining it elsewhere
  local host=$1 ray addr role
  ray=$(ray_bin)
  addr=$NET0.$((10 + ${host#h}))
  if [ "$host" = h1 ]; then
    role=(--head --port "$RAY_GCS_PORT" --include-dashboard false)
  else
    role=(--address "$NET0.11:$RAY_GCS_PORT")
  fi
  mkdir -p "$RAY_DIR/$host/local" "$RAY_LOCAL"
  chmod 700 "$RAY_DIR/$host/local"
  local start=(env RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled "$ray" start "${role[@]}" --node-ip-address "$addr"
    --num-cpus "$RAY_CPUS" --object-store-memory "$RAY_OBJECT_STORE" --resources "{\"$host\": 1}"
    --temp-dir "$RAY_DIR/$host" --disable-usage-stats --node-manager-port 6391
    --object-manager-port 6392 --metrics-export-port 6394 --dashboard-agent-listen-port 6395
    --dashboard-agent-grpc-port 6396 --runtime-env-agent-port 6397
    --min-worker-port "${RAY_WORKER_PORTS% *}" --max-worker-port "${RAY_WORKER_PORTS#* }")
  if [ "$host" = h1 ]; then
    run_on "$host" "${start[@]}" >"$RAY_DIR/$host.start.log" 2>&1
  else
    # The node's Ray, and every worker it starts, see $RAY_LOCAL as this host's own directory.
    # shellcheck disable=SC2016
    run_on "$host" unshare --mount --propagation private -- sh -c \
      'mount --bind "$0" "$1" && shift && exec "$@"' \
      "$RAY_DIR/$host/local" "$RAY_LOCAL" "${start[@]}" >"$RAY_DIR/$host.start.log" 2>&1
  fi || { tail -n 5 "$RAY_DIR/$host.start.log" >&2; die "ray start failed on $host (see $RAY_DIR/$host.start.log)"; }
}

cmd_ray() {
  need_root
  local names host
  names=$(hosts)
  [ -n "$names" ] || die "the lab is not up (make lab)"
  ray_bin >/dev/null
  mkdir -p "$RAY_DIR"
  local all=1 any=0
  for host in $names; do
    if ray_daemons_up "$host"; then any=1; else all=0; fi
  done
  if [ -f "$RAY_DIR/up" ] && [ "$all" = 1 ]; then
    log "Ray is up on the lab: RAY_ADDRESS=$(cat "$RAY_DIR/up")"
    return
  fi
  if [ "$any" = 1 ]; then  # a part of it died, or a start was cut short: start it again whole
    cmd_ray_stop >/dev/null
    mkdir -p "$RAY_DIR"
  fi
  for host in $names; do ray_port_free "$host"; done
  for host in $names; do ray_start_on "$host"; done
  echo "$NET0.11:$RAY_GCS_PORT" > "$RAY_DIR/up"
  log "Ray is up on the lab: RAY_ADDRESS=$NET0.11:$RAY_GCS_PORT"
}

cmd_ray_stop() {
  need_root
  local host bin
  bin=$( (ray_bin) 2>/dev/null) || bin=""
  # `ray stop` sees only its host's processes (each host has its own PID namespace): nodes
  # first, the head last. Nothing of the machine's own Ray is touched. It runs wherever the lab
  # has a host (a start cut short may have left a GCS without a raylet).
  for host in $(hosts | sort -r); do
    [ -n "$(host_pid "$host")" ] && [ -n "$bin" ] || continue
    run_on "$host" env RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled timeout 60 "$bin" stop --force \
      >/dev/null 2>&1 || true
  done
  # (a daemon's last log lines may land while the folder goes)
  rm -rf "$RAY_DIR" 2>/dev/null || { sleep 1; rm -rf "$RAY_DIR"; }
  log "Ray is down on the lab"
}

cmd_status() {
  local names
  names=$(hosts)
  if [ -z "$names" ]; then
    echo "lab: not up (make lab)"
    return 1
  fi
  local name down=0
  for name in $names; do
    local pid
    pid=$(host_pid "$name")
    if [ -z "$pid" ]; then
      echo "$name  down"
      down=1
      continue
    fi
    local addrs
    addrs=$(ip -n "$PREFIX-$name" -4 -o addr show | awk '$2 != "lo" {printf "%s %s  ", $2, $4}')
    echo "$name  $addrs"
  done
  return "$down"
}

cmd_down() {
  need_root
  local ns name pid
  for name in $(hosts) $(ls "$STATE" 2>/dev/null | sed -n 's/\.pid$//p'); do
    pid=$(host_pid "$name")
    # pid 1 of the host's PID namespace: killing it kills everything still running there.
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  done
  for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
    ip netns del "$ns"
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true
  rm -rf "$STATE"
  log "down"
}

main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case "$cmd" in
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    exec) cmd_exec "$@" ;;
    fw) cmd_fw "$@" ;;
    mtu) cmd_mtu "$@" ;;
    slurm) cmd_slurm ;;
    ray) cmd_ray ;;
    ray-stop) cmd_ray_stop ;;
    fw-clear) [ $# -eq 1 ] || die "usage: lab.sh fw-clear HOST"; cmd_fw_clear "$1" ;;
    *) die "usage: lab.sh up [N] | down | status | exec [--hosts FILE] HOST CMD... | fw HOST RULE... | fw-clear HOST | mtu HOST DEV MTU | slurm | ray | ray-stop" ;;
  esac
}

main "$@"
