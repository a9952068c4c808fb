#!/usr/bin/env bash
# Stops the cluster that tests/slurm/start_slurm.sh started in STATE_DIR: cancels the jobs left,
# stops slurmd (every node's), slurmctld (and munged, when start_slurm.sh started it) by their PID files and
# removes the /etc/slurm links into STATE_DIR and a multi-node cluster's network. Stopping a stopped cluster is fine.
set -uo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $0 STATE_DIR" >&2
    exit 2
fi
if [ ! -d "$1" ]; then
    exit 0
fi
D="$(cd "$1" && pwd)"
export SLURM_CONF="$D/slurm.conf"

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

pid_of() {
    local file="$1"
    [ -f "$file" ] && tr -dc '0-9' < "$file"
}

# Stops the daemons whose PIDs are in the files given: SIGTERM to all, then SIGKILL to any still
# running after 10 s.
stop_daemons() {
    local file pid pids=()
    for file in "$@"; do
        pid="$(pid_of "$file")" || true
        if alive "$pid"; then
            kill -TERM "$pid" 2>/dev/null
            pids+=("$pid")
        fi
    done
    for _ in $(seq 100); do
        local running=0
        for pid in "${pids[@]}"; do
            alive "$pid" && running=1
        done
        [ "$running" -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        if alive "$pid"; then
            echo "stop_slurm: $pid ($(cat /proc/"$pid"/comm 2>/dev/null)) ignored SIGTERM; killing it" >&2
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    rm -f "$@"
}

ctld_pid="$(pid_of "$D/slurmctld.pid")" || true
if alive "$ctld_pid" && command -v squeue >/dev/null; then
    jobs="$(timeout 10 squeue -h -t PENDING,RUNNING,SUSPENDED,COMPLETING -o %i 2>/dev/null || true)"
    if [ -n "$jobs" ]; then
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs 2>/dev/null || true
        for _ in $(seq 50); do
            [ -z "$(timeout 10 squeue -h -t PENDING,RUNNING,SUSPENDED,COMPLETING -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
fi

stop_daemons "$D"/slurmd*.pid "$D/slurmctld.pid"
if [ -f "$D/network" ]; then
    # shellcheck source=tests/slurm/nodes.sh
    . "$(dirname "$0")/nodes.sh"
    teardown_network
fi
if [ -f "$D/munged.started" ]; then
    stop_daemons /run/munge/munged.pid
    rm -f "$D/munged.started"
fi

for f in slurm.conf gres.conf; do
    link="/etc/slurm/$f"
    if [ -L "$link" ] && [ "$(readlink "$link")" = "$D/$f" ]; then
        rm -f "$link"
    fi
done
exit 0
