#!/usr/bin/env bash
# Start torchft's lighthouse and two replica groups, each its own torchrun, as torchft's README
# teaches; wait for both groups. Usage: run.sh SCRIPT MODE
# LIGHTHOUSE_PORT picks the lighthouse's port (default: a free one).
set -u
script="$1"; mode="${2:-healthy}"
port="${LIGHTHOUSE_PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}"
here="$(cd "$(dirname "$0")" && pwd)"
case "$script" in /*) ;; *) script="$here/$script" ;; esac
torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 \
    --bind "[::]:$port" &
lighthouse=$!
trap 'kill $lighthouse 2>/dev/null' EXIT
export TORCHFT_LIGHTHOUSE="http://localhost:$port" NUM_REPLICA_GROUPS=2
pids=()
for group in 0 1; do
    REPLICA_GROUP_ID=$group torchrun --standalone --nnodes 1 --nproc-per-node 1 \
        --max-restarts 1 "$script" "$mode" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
done
exit $status
