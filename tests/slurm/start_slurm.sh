#!/usr/bin/env bash
# Starts a single-node SLURM cluster on localhost (munged, slurmctld, slurmd) without systemd, for
# the tests. Usage, as root:
#
#   eval "$(tests/slurm/start_slurm.sh STATE_DIR)"      # exports SLURM_CONF
#   ...                                                 # sbatch, srun, snakemake --profile ...
#   tests/slurm/stop_slurm.sh STATE_DIR
#
# STATE_DIR receives slurm.conf, gres.conf, the daemons' state, PID files and logs. The node
# advertises FAKE_CPUS CPUs (default 8) and FAKE_GPUS GPUs (default 2) whatever the machine has:
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
START_TIMEOUT_S="${START_TIMEOUT_S:-60}"

for tool in munged munge unmunge slurmctld slurmd sinfo scontrol; do
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
rm -f "$D"/slurmctld.pid "$D"/slurmd.pid "$D"/munged.started

fail() {
    echo "start_slurm: $*" >&2
    for log in /var/log/munge/munged.log "$D/log/slurmctld.log" "$D/log/slurmd.log"; do
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

gres_line=""
: > "$D/gres.conf.new"
echo "AutoDetect=off" >> "$D/gres.conf.new"
if [ "$FAKE_GPUS" -gt 0 ]; then
    gres_line=" Gres=gpu:$FAKE_GPUS"
    for i in $(seq 0 $((FAKE_GPUS - 1))); do
        rm -f "$D/nvidia$i"
        mknod "$D/nvidia$i" c 1 3
        echo "NodeName=localhost Name=gpu File=$D/nvidia$i" >> "$D/gres.conf.new"
    done
fi
mv "$D/gres.conf.new" "$D/gres.conf"

cat > "$D/slurm.conf" <<CONF
# Single-node test cluster written by tests/slurm/start_slurm.sh.
ClusterName=localcluster
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
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
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$FAKE_CPUS RealMemory=$real_mem$gres_line State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

mkdir -p /etc/slurm
for f in slurm.conf gres.conf; do
    ln -sfn "$D/$f" "/etc/slurm/$f"
done
export SLURM_CONF="$D/slurm.conf"

slurmctld -c -i || fail "slurmctld did not start"
slurmd -N localhost || fail "slurmd did not start"

deadline=$((SECONDS + START_TIMEOUT_S))
until [ "$(sinfo -h -n localhost -o %T 2>/dev/null)" = "idle" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        fail "the node is not idle after ${START_TIMEOUT_S}s (sinfo: $(sinfo -h -o '%N %T' 2>&1 | tr '\n' ' '))"
    fi
    sleep 0.2
done

echo "export SLURM_CONF=$D/slurm.conf"
