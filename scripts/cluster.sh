#!/usr/bin/env bash
# A one-host Slurm for the tests marked `slurm`: Debian's slurm-wlm and munge, slurmctld and slurmd
# on this host with its CPUs. Idempotent: `make cluster` again finds it up and returns at once.
#   scripts/cluster.sh start    install (once), configure, start the daemons, wait for an idle node
#   scripts/cluster.sh stop     stop the daemons (`make cluster-stop`)
# Needs root (CI runs as root). Everything it starts is a daemon; nothing is left in the foreground.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)
CPUS=$(nproc)
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
RUN=/run/slurm

log() { echo "cluster: $*"; }

idle() {
  # the node answers and is idle (or mixed/allocated by a test still running: it is up)
  # (bounded: sinfo waits about 10 s for a controller that is not there)
  timeout 3 sinfo -h -N -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'
}

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    return
  fi
  log "installing slurm-wlm and munge (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurm-wlm munge >/dev/null
}

configure() {
  mkdir -p /etc/slurm "$STATE" "$SPOOL" "$LOGS" "$RUN"
  local want
  want=$(cat <<CONF
# written by scripts/cluster.sh: one host, its CPUs, root daemons (a test cluster only)
ClusterName=ddpdoctor
SlurmctldHost=$HOST
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
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=5
InactiveLimit=0
MinJobAge=60
NodeName=$HOST CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
)
  if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$want" ]; then
    printf '%s\n' "$want" > "$CONF"
    log "wrote $CONF ($HOST, $CPUS CPUs)"
    CONF_CHANGED=1
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    log "created the munge key"
  fi
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
}

# Each daemon by its pid file: only what this script started is checked or stopped.
pidfile() {
  case "$1" in
    munged) echo /run/munge/munged.pid ;;
    *) echo "$RUN/$1.pid" ;;
  esac
}
running() {
  local file pid
  file=$(pidfile "$1")
  [ -s "$file" ] || return 1
  pid=$(cat "$file")
  # a dead daemon not yet reaped (state Z) keeps its name: it is not running
  [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] \
    && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}
stop_one() {
  if running "$1"; then
    kill "$(cat "$(pidfile "$1")")" || true
  fi
}

start() {
  install
  CONF_CHANGED=0
  configure
  if [ "$CONF_CHANGED" = 1 ]; then
    stop_daemons
  fi
  if ! running munged; then
    runuser -u munge -- /usr/sbin/munged
    log "started munged"
  fi
  if ! running slurmctld; then
    /usr/sbin/slurmctld
    log "started slurmctld"
  fi
  if ! running slurmd; then
    /usr/sbin/slurmd
    log "started slurmd"
  fi
  for _ in $(seq 1 60); do
    if idle; then
      timeout 3 scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
      log "up: $(timeout 3 sinfo -h -N -o '%N %T %c CPUs')"
      return 0
    fi
    # a node left down or drained by an earlier run comes back
    timeout 3 scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  log "the node never became idle:"
  sinfo -N || true
  tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" || true
  return 1
}

stop_daemons() {
  stop_one slurmd
  stop_one slurmctld
  for _ in $(seq 1 20); do
    running slurmd || running slurmctld || break
    sleep 0.5
  done
}

stop() {
  stop_daemons
  stop_one munged
  log "stopped"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
