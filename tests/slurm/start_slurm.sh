#!/usr/bin/env bash
# Starts a SLURM cluster on this machine (munged, slurmctld, slurmd) without systemd, for the tests:
# one node named localhost, or, with NODES=N, N nodes node1..nodeN, each slurmd in network and UTS
# namespaces of its own (its own hostname and address on a bridge, so that jobs spanning nodes see
# distinct hosts, as on a real cluster; see nodes.sh). Usage, as root:
#
#   eval "$(tests/slurm/start_slurm.sh STATE_DIR)"      # exports SLURM_CONF
#   ...                                                 # sbatch, srun, snakemake --profile ...
#   tests/slurm/stop_slurm.sh STATE_DIR
#
# STATE_DIR receives slurm.conf, gres.conf, the daemons' state, PID files and logs. The node
# (each node) advertises FAKE_CPUS CPUs (default 8) and FAKE_GPUS GPUs (default 2) whatever the machine has:
# each GPU is a character device cloned from /dev/null, enough for SLURM to hand out
# CUDA_VISIBLE_DEVICES. slurm.conf and gres.conf are linked into /etc/slurm/, where job steps look
# for them (the Snakemake job step drops SLURM_CONF). Only the export lines go to stdout.
# Starting while a cluster runs restarts it. Installs nothing: see install_slurm.sh.
set -euo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $0 STATE_DIR" >&2
    exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$1"
D="$(cd "$1" && pwd)"
FAKE_CPUS="${FAKE_CPUS:-8}"
FAKE_GPUS="${FAKE_GPUS:-2}"
NODES="${NODES:-0}"
START_TIMEOUT_S="${START_TIMEOUT_S:-60}"

for tool in munged munge unmunge slurmctld slurmd sinfo scontrol $([ "$NODES" -gt 0 ] && echo ip nsenter unshare); do
    if ! command -v "$tool" >/dev/null; then
        echo "start_slurm: $tool not found; run tests/slurm/install_slurm.sh first" >&2
        exit 1
    fi
done

# A cluster already running (from this or another state directory) is stopped first: there is one
# /etc/slurm and one pair of ports per machine.
for conf in /etc/slurm/slurm.conf "$D/slurm.conf"; do
    if [ -e "$conf" ]; then
        old="$(dirname "$(readlink -f "$conf")")"
        if [ -f "$old/slurmctld.pid" ] || [ -f "$old/slurmd.pid" ]; then
            bash "$here/stop_slurm.sh" "$old" >&2
        fi
    fi
done

mkdir -p "$D/state" "$D/spool" "$D/log"
rm -f "$D"/slurmctld.pid "$D"/slurmd*.pid "$D"/munged.started

fail() {
    echo "start_slurm: $*" >&2
    for log in /var/log/munge/munged.log "$D/log/slurmctld.log" "$D"/log/slurmd*.log; do
        if [ -f "$log" ]; then
            echo "--- tail of $log" >&2
            tail -n 25 "$log" >&2
        fi
    done
    exit 1
}

# munge: reuse a daemon that already answers, otherwise start one (and remember that it is ours).
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    if [ ! -f /etc/munge/munge.key ]; then
        fail "/etc/munge/munge.key is missing (reinstall munge)"
    fi
    rm -f /run/munge/munged.pid
    runuser -u munge -- munged --num-threads=2 || fail "munged did not start"
    touch "$D/munged.started"
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || fail "munged does not answer"
fi

mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
real_mem=$((mem_mb > 1024 ? mem_mb - 512 : mem_mb))

if [ "$NODES" -gt 0 ]; then
    # shellcheck source=tests/slurm/nodes.sh
    . "$here/nodes.sh"
    setup_network || fail "could not set up the nodes' network (bridge $BRIDGE, namespaces e3dg-node*)"
    node_names=()
    for n in $(seq "$NODES"); do node_names+=("node$n"); done
else
    node_names=(localhost)
fi

gres_line=""
: > "$D/gres.conf.new"
echo "AutoDetect=off" >> "$D/gres.conf.new"
if [ "$FAKE_GPUS" -gt 0 ]; then
    gres_line=" Gres=gpu:$FAKE_GPUS"
    for node in "${node_names[@]}"; do
        mkdir -p "$D/gpus/$node"
        for i in $(seq 0 $((FAKE_GPUS - 1))); do
            rm -f "$D/gpus/$node/nvidia$i"
            mknod "$D/gpus/$node/nvidia$i" c 1 3
            echo "NodeName=$node Name=gpu File=$D/gpus/$node/nvidia$i" >> "$D/gres.conf.new"
        done
    done
fi
mv "$D/gres.conf.new" "$D/gres.conf"

if [ "$NODES" -gt 0 ]; then
    controller="$(hostname -s)($BRIDGE_ADDR)"
    node_lines=""
    for n in $(seq "$NODES"); do
        node_lines+="NodeName=node$n NodeHostname=node$n NodeAddr=$(node_addr "$n") CPUs=$FAKE_CPUS RealMemory=$real_mem$gres_line State=UNKNOWN"$'\n'
    done
    partition_nodes="node[1-$NODES]"
    slurmd_files="SlurmdSpoolDir=$D/spool/%n
SlurmdPidFile=$D/slurmd.%n.pid
SlurmdLogFile=$D/log/slurmd.%n.log"
else
    controller=localhost
    node_lines="NodeName=localhost NodeAddr=127.0.0.1 CPUs=$FAKE_CPUS RealMemory=$real_mem$gres_line State=UNKNOWN"
    partition_nodes=localhost
    slurmd_files="SlurmdSpoolDir=$D/spool
SlurmdPidFile=$D/slurmd.pid
SlurmdLogFile=$D/log/slurmd.log"
fi

cat > "$D/slurm.conf" <<CONF
# Test cluster written by tests/slurm/start_slurm.sh.
ClusterName=localcluster
SlurmctldHost=$controller
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$D/state
SlurmctldPidFile=$D/slurmctld.pid
SlurmctldLogFile=$D/log/slurmctld.log
$slurmd_files
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# Advertise more CPUs and GPUs than the machine has.
SlurmdParameters=config_overrides
# Finished jobs stay visible to squeue this long (there is no accounting database for sacct).
MinJobAge=600
GresTypes=gpu
$node_lines
PartitionName=debug Nodes=$partition_nodes Default=YES MaxTime=INFINITE State=UP
CONF

mkdir -p /etc/slurm
for f in slurm.conf gres.conf; do
    ln -sfn "$D/$f" "/etc/slurm/$f"
done
export SLURM_CONF="$D/slurm.conf"

slurmctld -c -i || fail "slurmctld did not start"
if [ "$NODES" -gt 0 ]; then
    for n in $(seq "$NODES"); do
        start_node_slurmd "$n" || fail "slurmd of node$n did not start"
    done
else
    slurmd -N localhost || fail "slurmd did not start"
fi

deadline=$((SECONDS + START_TIMEOUT_S))
until [ "$(sinfo -h -o %T 2>/dev/null | sort -u)" = "idle" ] \
    && [ "$(sinfo -h -N -o %N 2>/dev/null | sort -u | wc -l)" -eq "${#node_names[@]}" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        fail "the node is not idle after ${START_TIMEOUT_S}s (sinfo: $(sinfo -h -o '%N %T' 2>&1 | tr '\n' ' '))"
    fi
    sleep 0.2
done

echo "export SLURM_CONF=$D/slurm.conf"
