#!/usr/bin/env bash
# A one-node Slurm cluster for campaign tests: munge and slurmctld/slurmd
# from Debian's packages, everything they write under one state directory.
#
#   bash scripts/slurm-cluster.sh up STATE_DIR     # installs if needed, starts, waits for the node
#   bash scripts/slurm-cluster.sh down STATE_DIR   # stops the daemons
#
# After `up`, point clients at the cluster with
#   export SLURM_CONF=STATE_DIR/slurm.conf
# Installing and starting the daemons needs root (CI runs as root).
set -euo pipefail

action=${1:?usage: slurm-cluster.sh up|down STATE_DIR}
state=${2:?usage: slurm-cluster.sh up|down STATE_DIR}
mkdir -p "$state"
state=$(cd "$state" && pwd)
conf="$state/slurm.conf"

down() {
    # The pids first: a daemon removes its pid file as it exits.
    local pidfiles=("$state/slurmd.pid" "$state/slurmctld.pid" "$state/munged.pid")
    local pids=() pidfile pid
    for pidfile in "${pidfiles[@]}"; do
        if [ -f "$pidfile" ]; then
            pids+=("$(cat "$pidfile")")
        fi
    done
    if [ -f "$conf" ]; then
        SLURM_CONF="$conf" scontrol shutdown >/dev/null 2>&1 || true
    fi
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    # Back only when they are gone: slurmctld writes its state files as it
    # shuts down, and a caller that removes the state directory at once
    # would find them written again after it.
    for _ in $(seq 100); do
        local alive=0
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then
                alive=1
            fi
        done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    rm -f "${pidfiles[@]}"
}

if [ "$action" = down ]; then
    down
    exit 0
fi
[ "$action" = up ] || { echo "slurm-cluster.sh: unknown action '$action' (up or down)" >&2; exit 2; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "slurm-cluster.sh: slurm-wlm and munge are not installed, and installing them needs root" >&2
        exit 2
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

down  # a cluster left by an earlier run in the same directory
mkdir -p "$state/ctld" "$state/spool" "$state/munge"
chmod 700 "$state/munge"
# A key of our own, so the test never depends on (or touches) the machine's.
head -c 1024 /dev/urandom > "$state/munge/munge.key"
chmod 400 "$state/munge/munge.key"
munged --force --key-file="$state/munge/munge.key" --socket="$state/munge/munge.socket" \
    --pid-file="$state/munged.pid" --log-file="$state/munged.log" --seed-file="$state/munge/seed"

host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ { print $2 }' /proc/meminfo) / 1024 - 512 ))
cat > "$conf" <<EOF
ClusterName=nanhunt
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits out the credential lifetime (120 s by default).
AuthInfo=socket=$state/munge/munge.socket,cred_expire=10
CredType=cred/munge
SlurmctldPort=${NANHUNT_SLURMCTLD_PORT:-6817}
SlurmdPort=${NANHUNT_SLURMD_PORT:-6818}
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
# No cgroups: the test runs in containers without a delegated hierarchy.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
JobRequeue=1
# Quick scheduling for a test cluster: array tasks start within a second.
SchedulerParameters=sched_min_interval=100000
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=campaigns Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

slurmctld -c -f "$conf"
slurmd -c -f "$conf"
export SLURM_CONF="$conf"
for _ in $(seq 60); do
    if [ "$(sinfo -h -o %t 2>/dev/null)" = idle ]; then
        echo "slurm: node $host idle ($cpus CPUs), SLURM_CONF=$conf"
        exit 0
    fi
    sleep 0.5
done
echo "slurm-cluster.sh: the node did not come up within 30 s; logs:" >&2
tail -n 20 "$state"/*.log >&2 || true
down
exit 1
