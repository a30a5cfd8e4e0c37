# Sourced by the real-Slurm tests (slurm_cases.sh): a Slurm cluster of
# Debian's own daemons (munged, slurmctld, slurmd) on this machine, started in
# a scratch directory with its own configuration, ports, state and logs, so
# that nothing of the machine's /etc/slurm or /run is used or changed. Needs
# root (slurmd starts the tasks; SlurmUser is root) and Debian's packages
# slurmctld, slurmd, slurm-client and munge (scripts/setup.sh installs them
# for the test suite).
#
#   slurm_missing                   prints why no cluster can start here, or
#                                   nothing when one can
#   slurm_start DIR PYTHON [NODES]  writes DIR/slurm.conf, starts the daemons
#                                   (pids in DIR/*.pid) and waits until every
#                                   node is idle; exports SLURM_CONF so that
#                                   srun, sbatch, salloc, squeue and scontrol
#                                   use it. DIR's parents must be searchable
#                                   by all (munged checks).
#     NODES 1 (default): one node, this machine's host name at 127.0.0.1, 4
#       CPUs as slurmctld sees it (more tasks than cores may run at once), so
#       that the MASTER_ADDR that ddp derives from SLURM_JOB_NODELIST is a
#       name this machine resolves.
#     NODES 2: two nodes n1 and n2 (2 CPUs each), each slurmd in its own
#       network namespace (10.231.S.1 and .2 on a bridge, slurmctld at .254)
#       and its own mount namespace, where /etc/hosts names the nodes and
#       /tmp is the node's own (DIR/tmp-n1, DIR/tmp-n2), as on separate
#       machines; the rest of the file system is shared, as a cluster's
#       shared file system is. DIR must not be under /tmp. slurm_netns_missing
#       says why this cannot run here.
#   slurm_stop                      stops the daemons by their pids (and the
#                                   jobs' tasks with slurmd) and removes the
#                                   namespaces
#   slurm_logs                      prints the daemons' logs' last lines
#   slurm_wait_job ID SECONDS       waits until job ID has left the queue;
#                                   fails (and cancels it) after SECONDS

slurm_missing() {
  local tool
  for tool in munged slurmctld slurmd srun sbatch salloc scontrol squeue; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
      echo "$tool not found (Debian: apt-get install slurmctld slurmd slurm-client munge)"
      return
    fi
  done
  if [ "$(id -u)" -ne 0 ]; then
    echo "not root: slurmd must run as root to start the tasks"
    return
  fi
  if ! getent hosts "$(hostname)" >/dev/null 2>&1; then
    echo "this machine's host name '$(hostname)' does not resolve (add it to /etc/hosts)"
  fi
}

# The namespaces' names and subnet: this shell's pid, so that two runs side
# by side do not meet.
slurm_ns=ddp$$
slurm_subnet=10.231.$(($$ % 250))

slurm_netns_missing() {
  local tool
  for tool in ip nsenter unshare mount; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool not found (Debian: iproute2, util-linux)"; return; }
  done
  if ! ip netns add "${slurm_ns}probe" 2>/dev/null; then
    echo "cannot create a network namespace (ip netns add: no CAP_SYS_ADMIN?)"
    return
  fi
  ip netns del "${slurm_ns}probe"
  if ! unshare -m true 2>/dev/null; then
    echo "cannot create a mount namespace (unshare -m)"
  fi
}

# The two nodes' network: a bridge in this namespace, a namespace per node
# with a veth pair into the bridge; and the nodes' /etc/hosts and /tmp.
_slurm_net() {
  local n
  ip link add "${slurm_ns}br" type bridge || return 1
  ip addr add "$slurm_subnet.254/24" dev "${slurm_ns}br" || return 1
  ip link set "${slurm_ns}br" up || return 1
  printf '127.0.0.1 localhost\n%s %s\n' "$slurm_subnet.254" "$(hostname)" >"$slurm_dir/hosts"
  for n in 1 2; do
    ip netns add "${slurm_ns}n$n" || return 1
    ip link add "${slurm_ns}v$n" type veth peer name eth0 netns "${slurm_ns}n$n" || return 1
    ip link set "${slurm_ns}v$n" master "${slurm_ns}br" || return 1
    ip link set "${slurm_ns}v$n" up || return 1
    ip -n "${slurm_ns}n$n" addr add "$slurm_subnet.$n/24" dev eth0 || return 1
    ip -n "${slurm_ns}n$n" link set eth0 up || return 1
    ip -n "${slurm_ns}n$n" link set lo up || return 1
    printf '%s n%s\n' "$slurm_subnet.$n" "$n" >>"$slurm_dir/hosts"
    mkdir -p "$slurm_dir/tmp-n$n"
    chmod 1777 "$slurm_dir/tmp-n$n"
  done
}

slurm_start() {
  slurm_dir=$1
  slurm_nodes=${3:-1}
  local python=$2 host ctld_addr ctld_port slurmd_port i n idle nodes_conf
  host=$(hostname)
  PATH=$PATH:/usr/sbin
  mkdir -p "$slurm_dir/state"
  # munged refuses a key that others can read, a socket directory that others
  # can write (without the sticky bit) or cannot search (mktemp -d gives 700).
  chmod 755 "$slurm_dir"
  head -c 1024 /dev/urandom >"$slurm_dir/munge.key"
  chmod 600 "$slurm_dir/munge.key"
  munged --socket="$slurm_dir/munge.socket" --key-file="$slurm_dir/munge.key" \
    --pid-file="$slurm_dir/munged.pid" --log-file="$slurm_dir/munged.log" \
    --seed-file="$slurm_dir/munged.seed" || return 1
  ctld_port=$(free_port "$python")
  slurmd_port=$(free_port "$python")
  while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port "$python"); done
  if [ "$slurm_nodes" = 1 ]; then
    ctld_addr=127.0.0.1
    nodes_conf="NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN"
    mkdir -p "$slurm_dir/spool-$host"
  else
    _slurm_net || { echo "slurm_start: could not set up the nodes' network namespaces"; return 1; }
    ctld_addr=$slurm_subnet.254
    nodes_conf="NodeName=n1 NodeAddr=$slurm_subnet.1 CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr=$slurm_subnet.2 CPUs=2 State=UNKNOWN"
    mkdir -p "$slurm_dir/spool-n1" "$slurm_dir/spool-n2"
  fi
  cat >"$slurm_dir/slurm.conf" <<EOF
# Written by tests/launch/slurm/slurm_cluster.sh.
ClusterName=ddptest
SlurmctldHost=$host($ctld_addr)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$slurm_dir/munge.socket
CredType=cred/munge
StateSaveLocation=$slurm_dir/state
SlurmdSpoolDir=$slurm_dir/spool-%n
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd-%n.pid
SlurmctldLogFile=$slurm_dir/slurmctld.log
SlurmdLogFile=$slurm_dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
# Start a job whose begin time has come within 2 s, not at the next 60 s pass.
SchedulerParameters=sched_interval=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=2
MinJobAge=2
$nodes_conf
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$slurm_dir/slurm.conf
  slurmctld -f "$SLURM_CONF" || return 1
  if [ "$slurm_nodes" = 1 ]; then
    slurmd -f "$SLURM_CONF" || return 1
  else
    for n in 1 2; do
      # nsenter, not `ip netns exec`, which remounts /sys without the
      # cgroup file system that slurmd looks for.
      nsenter --net="/var/run/netns/${slurm_ns}n$n" unshare -m -u sh -c "
        mount --bind '$slurm_dir/hosts' /etc/hosts && mount --bind '$slurm_dir/tmp-n$n' /tmp &&
          hostname n$n && exec slurmd -f '$SLURM_CONF' -N n$n" || return 1
    done
  fi
  for ((i = 0; i < 300; i++)); do
    idle=$(sinfo -h -o '%t %D' 2>/dev/null)
    if [ "$idle" = "idle $slurm_nodes" ]; then
      return 0
    fi
    sleep 0.1
  done
  echo "slurm_start: the nodes did not become idle within 30 s (sinfo: $idle)"
  slurm_logs
  return 1
}

slurm_stop() {
  local pid_file pid n
  [ -n "${slurm_dir:-}" ] || return 0
  for pid_file in "$slurm_dir"/slurmd-*.pid "$slurm_dir/slurmctld.pid" "$slurm_dir/munged.pid"; do
    pid=$(cat "$pid_file" 2>/dev/null) && kill "$pid" 2>/dev/null
  done
  sleep 0.5
  for pid_file in "$slurm_dir"/slurmd-*.pid "$slurm_dir/slurmctld.pid" "$slurm_dir/munged.pid"; do
    pid=$(cat "$pid_file" 2>/dev/null) && kill -9 "$pid" 2>/dev/null
  done
  if [ "${slurm_nodes:-1}" != 1 ]; then
    for n in 1 2; do ip netns del "${slurm_ns}n$n" 2>/dev/null; done
    ip link del "${slurm_ns}br" 2>/dev/null
  fi
}

slurm_logs() {
  local log
  for log in "$slurm_dir"/slurmctld.log "$slurm_dir"/slurmd-*.log; do
    echo "--- last lines of $log"
    tail -n 15 "$log" 2>/dev/null
  done
}

slurm_wait_job() {
  local i out
  for ((i = 0; i < $2 * 10; i++)); do
    # Gone: not listed, or (once slurmctld purged it, MinJobAge) unknown.
    out=$(squeue -h -j "$1" -o %i 2>&1)
    if [ -z "$out" ] || [[ $out == *"Invalid job id"* ]]; then
      return 0
    fi
    sleep 0.1
  done
  echo "slurm_wait_job: job $1 still queued or running after $2 s ($out); cancelling it"
  scancel "$1"
  return 1
}
