#!/usr/bin/env bash
# A small real Slurm cluster on this machine, for the Slurm launcher's tests (tests/integration/slurm)
# and for trying launcher=slurm by hand. Needs root (network namespaces, apt).
#
#   bash scripts/slurm_setup.sh          # install: slurmctld, slurmd, munge, slurm-client (apt), once;
#                                        # exits at once when they are installed (the cached phase of test.sh)
#   bash scripts/slurm_setup.sh up       # start the cluster; prints `export SLURM_CONF=...`
#   bash scripts/slurm_setup.sh down     # stop it and remove everything `up` made
#
# The cluster: slurmctld (hostname rlsctl, in its own UTS namespace) on 10.79.0.1, the address of
# the bridge rlslurmbr on this host, and four nodes rlsn1..rlsn4, each a slurmd in a network
# namespace of its own (rlslurm-n1..4, 10.79.0.11..14 on a veth to the bridge) with its own
# hostname (a UTS namespace inside it), spool directory, pid and log file. Debian's slurmd is
# not built for several slurmds per host, so each node is a host of its own as far as the network
# and its name go. One munged serves all of them (they share the filesystem, so its socket).
# Plugins that work in a container without cgroup delegation: proctrack/linuxproc, task/none.
# Two partitions: `main` (the default) and `urgent`, whose jobs preempt main's (CANCEL with a
# GraceTime of 30 s: the tasks get SIGTERM, then SIGKILL 30 s later), for the preemption test.
# Everything `up` writes lives in ${RLMESH_SLURM_DIR:-~/.cache/rlmesh/slurm}; `down` leaves the packages.
set -euo pipefail

dir="${RLMESH_SLURM_DIR:-$HOME/.cache/rlmesh/slurm}"
bridge=rlslurmbr
subnet=10.79.0
nodes=(1 2 3 4)
ctl_port=16817
node_port=16818
mkdir -p "$dir"

log() { echo "slurm_setup: $*"; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
      && command -v srun >/dev/null; then
    log "slurmctld, slurmd, munge and the client commands are installed"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    log "needs root the first time (apt-get install slurmctld slurmd munge slurm-client)" >&2
    return 2
  fi
  exec 9>"$dir/.install.lock"
  flock 9
  log "installing slurmctld slurmd munge slurm-client (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd munge slurm-client \
    >/dev/null 2>"$dir/apt.err" || {
    apt-get update -qq >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd munge slurm-client >/dev/null
  }
  log "installed: $(slurmd -V)"
}

munge_up() {
  [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile /etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    return 0
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  touch "$dir/munged.ours"  # `down` stops it; a munged that was already running is left alone
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "munged did not start" >&2
  return 1
}

write_conf() {
  mkdir -p "$dir/etc" "$dir/state" "$dir/log"
  for i in "${nodes[@]}"; do mkdir -p "$dir/spool/rlsn$i"; done
  cat > "$dir/etc/slurm.conf" <<CONF
# Written by scripts/slurm_setup.sh up: four nodes in network namespaces on $bridge ($subnet.0/24).
ClusterName=rlmesh
SlurmctldHost=rlsctl($subnet.1)
SlurmctldPort=$ctl_port
SlurmdPort=$node_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=5
MinJobAge=30
SchedulerType=sched/backfill
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
CONF
  for i in "${nodes[@]}"; do
    echo "NodeName=rlsn$i NodeAddr=$subnet.1$i CPUs=8 RealMemory=4000 State=UNKNOWN" >> "$dir/etc/slurm.conf"
  done
  cat >> "$dir/etc/slurm.conf" <<CONF
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL GraceTime=30
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
CONF
}

net_up() {
  ip link add "$bridge" type bridge
  ip addr add "$subnet.1/24" dev "$bridge"
  ip link set "$bridge" up
  for i in "${nodes[@]}"; do
    local ns="rlslurm-n$i"
    ip netns add "$ns"
    ip link add "rls$i-b" type veth peer name "rls$i-h"
    ip link set "rls$i-h" netns "$ns"
    ip link set "rls$i-b" master "$bridge"
    ip link set "rls$i-b" up
    ip -n "$ns" addr add "$subnet.1$i/24" dev "rls$i-h"
    ip -n "$ns" link set "rls$i-h" up
    ip -n "$ns" link set lo up
  done
}

# Start node i's slurmd: `nsenter --net` rather than `ip netns exec`, which remounts /sys and so
# hides /sys/fs/cgroup, without which slurmd 22.05 will not start even with proctrack/linuxproc.
node_up() {
  local i="$1"
  nsenter --net="/run/netns/rlslurm-n$i" unshare --uts sh -c \
    "hostname rlsn$i && exec slurmd -f '$dir/etc/slurm.conf'"
}

up() {
  down >/dev/null 2>&1 || true
  install
  munge_up
  write_conf
  net_up
  unshare --uts sh -c "hostname rlsctl && exec slurmctld -f '$dir/etc/slurm.conf'"
  for i in "${nodes[@]}"; do node_up "$i"; done
  export SLURM_CONF="$dir/etc/slurm.conf"
  for _ in $(seq 150); do
    if [ "$(sinfo -h -N -p main -o '%T' 2>/dev/null | grep -cx idle)" = "${#nodes[@]}" ]; then
      log "up: ${#nodes[@]} nodes idle"
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.2
  done
  log "the cluster did not come up; sinfo: $(sinfo -N 2>&1 | tr '\n' ' ')" >&2
  tail -n 20 "$dir/log/slurmctld.log" >&2 || true
  return 1
}

down() {
  for i in "${nodes[@]}"; do
    if [ -e "/run/netns/rlslurm-n$i" ]; then
      ip netns pids "rlslurm-n$i" | xargs -r kill -9 2>/dev/null || true
      ip netns del "rlslurm-n$i" 2>/dev/null || true
    fi
  done
  if [ -s "$dir/slurmctld.pid" ]; then
    kill -9 "$(cat "$dir/slurmctld.pid")" 2>/dev/null || true
    rm -f "$dir/slurmctld.pid"
  fi
  ip link del "$bridge" 2>/dev/null || true
  if [ -e "$dir/munged.ours" ] && [ -s /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
    rm -f "$dir/munged.ours"
  fi
  rm -rf "$dir/state" "$dir/spool" "$dir"/slurmd-*.pid
  log "down"
}

case "${1:-install}" in
  install) install ;;
  up) up ;;
  down) down ;;
  node-up) node_up "$2" ;;
  *) echo "usage: $0 [install|up|down|node-up N]" >&2; exit 2 ;;
esac
