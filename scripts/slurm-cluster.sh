#!/bin/bash
# A throw-away Slurm cluster on this machine, for tests and CI (needs root and the Debian
# packages slurm-wlm munge libpmix-dev). One slurmctld plus NODES (default 2) virtual nodes
# `slurmd -N nX`, each with CPUs=4 and 4 fake GPUs (character devices in DIR/fakedev), MPI via
# PMIx, no accounting. Everything lives in DIR; ports are derived from DIR so that several
# clusters (one per DIR) can run side by side.
#
#   eval "$(scripts/slurm-cluster.sh start DIR [NODES])"   # prints: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm-cluster.sh status DIR                     # exit 0 if controller and nodes are up
#   scripts/slurm-cluster.sh stop DIR                       # cancels jobs, stops the daemons it started
#
# Progress goes to stderr, the export line to stdout. munged is shared by every cluster on the
# machine and is left running by stop. Port base: DT_SLURM_PORT_BASE, else 20000 + hash(DIR).
set -u

die() { echo "slurm-cluster: $*" >&2; exit 1; }
say() { echo "slurm-cluster: $*" >&2; }

[ $# -ge 2 ] || die "usage: $0 start|stop|status DIR [NODES]"
cmd=$1
if [ "$cmd" = start ]; then mkdir -p "$2" 2>/dev/null || die "cannot create $2"; fi
if [ ! -d "$2" ]; then
  [ "$cmd" = stop ] && exit 0 # nothing was started there
  die "no cluster directory $2"
fi
DIR=$(cd "$2" && pwd -P) || die "cannot enter $2"
NODES=${3:-2}
case $NODES in '' | *[!0-9]*) die "NODES must be a number >= 1 (got '$NODES')" ;; esac
[ "$NODES" -ge 1 ] && [ "$NODES" -le 64 ] || die "NODES must be 1..64 (got $NODES)"
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF
RUN=$DIR/run

# A daemon counts as running when its pid file names a live, non-zombie process of that name
# (PID 1 here does not reap daemons: stopped ones linger as <defunct>).
alive() { # alive PIDFILE NAME
  [ -r "$1" ] || return 1
  local pid state comm
  pid=$(cat "$1" 2>/dev/null) || return 1
  case $pid in '' | *[!0-9]*) return 1 ;; esac
  [ -r "/proc/$pid/stat" ] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [ "$comm" = "$2" ] || return 1
  state=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

stop_pidfile() { # stop_pidfile PIDFILE NAME: TERM, wait up to 10 s, then KILL
  alive "$1" "$2" || { rm -f "$1"; return 0; }
  local pid i
  pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 100); do
    alive "$1" "$2" || break
    sleep 0.1
  done
  if alive "$1" "$2"; then
    say "$2 (pid $pid) ignored SIGTERM, killing it"
    kill -KILL "$pid" 2>/dev/null
    sleep 0.2
  fi
  rm -f "$1"
}

# ports_free BASE N: nothing listens on TCP ports BASE..BASE+N (IPv4 or IPv6)
ports_free() {
  local used=" " p hex
  for hex in $(awk 'NR > 1 && $4 == "0A" { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
    used="$used$((16#$hex)) "
  done
  for p in $(seq "$1" $(($1 + $2))); do
    case $used in *" $p "*) return 1 ;; esac
  done
  return 0
}

node_names() { local i; for i in $(seq "$NODES"); do echo "n$i"; done; }
nodes_in_conf() { sed -n 's/^# dtrain-nodes=//p' "$CONF" 2>/dev/null; }

ctld_up() { scontrol ping 2>/dev/null | grep -q "is UP"; }
nodes_idle() { # every configured node idle (or mixed/allocated: registered and usable)
  local states
  states=$(sinfo -h -N -o '%T' 2>/dev/null) || return 1
  [ -n "$states" ] || return 1
  ! echo "$states" | grep -Eqv '^(idle|mixed|allocated)$'
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  command -v munged >/dev/null || [ -x /usr/sbin/munged ] || die "munged not found (apt-get install munge)"
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none || die "cannot write the munge key"
  fi
  chown munge:munge /etc/munge/munge.key 2>/dev/null
  chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged || die "munged did not start (see /var/log/munge/munged.log)"
  local i
  for i in $(seq 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "munged is not answering (munge -n | unmunge fails)"
}

write_conf() {
  local host base ports last i cksum
  host=$(hostname -s)
  cksum=$(printf '%s' "$DIR" | cksum | cut -d' ' -f1)
  if [ -n "${DT_SLURM_PORT_BASE:-}" ]; then
    base=$DT_SLURM_PORT_BASE
  else # from the hash of DIR, moved on while another cluster (or anything) listens there
    base=$((20000 + (cksum % 500) * 80))
    for i in $(seq 500); do
      ports_free "$base" "$NODES" && break
      base=$((base + 80)); [ $base -le 59920 ] || base=20000
    done
  fi
  last=$((base + NODES))
  mkdir -p "$DIR/state" "$DIR/log" "$RUN" "$DIR/fakedev"
  for i in $(node_names); do mkdir -p "$DIR/spool/$i" "$DIR/tmp/$i"; done
  for i in 0 1 2 3; do
    [ -c "$DIR/fakedev/nvidia$i" ] || { rm -f "$DIR/fakedev/nvidia$i"; mknod "$DIR/fakedev/nvidia$i" c 1 3; } ||
      die "mknod $DIR/fakedev/nvidia$i failed (needs root and a filesystem that allows device nodes)"
  done
  cat >"$CONF" <<EOF
# Generated by scripts/slurm-cluster.sh for a throw-away cluster in $DIR
# dtrain-nodes=$NODES
ClusterName=dt$((cksum % 100000))
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
TmpFS=$DIR/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=pmix
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
GresTypes=gpu
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=30
NodeName=n[1-$NODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((base + 1))-$last] CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$DIR/gres.conf" <<EOF
AutoDetect=off
NodeName=n[1-$NODES] Name=gpu File=$DIR/fakedev/nvidia[0-3]
EOF
}

show_status() {
  local ok=0 n
  if alive "$RUN/slurmctld.pid" slurmctld; then say "slurmctld running (pid $(cat "$RUN/slurmctld.pid"))"; else say "slurmctld not running"; ok=1; fi
  for n in $(node_names); do
    if alive "$RUN/slurmd-$n.pid" slurmd; then say "slurmd $n running (pid $(cat "$RUN/slurmd-$n.pid"))"; else say "slurmd $n not running"; ok=1; fi
  done
  if [ $ok -eq 0 ]; then
    ctld_up || { say "controller not answering (scontrol ping)"; ok=1; }
    sinfo -N -o '%N %T %c %G' >&2 2>/dev/null
  fi
  return $ok
}

do_start() {
  [ "$(id -u)" -eq 0 ] || die "needs root (SlurmUser=root, mknod, munge)"
  command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || die "slurmctld not found (apt-get install slurm-wlm)"
  export PATH=$PATH:/usr/sbin
  # Already up with the same node count: nothing to do.
  if [ "$(nodes_in_conf)" = "$NODES" ] && show_status 2>/dev/null && nodes_idle; then
    say "already running in $DIR"
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  do_stop 2>/dev/null # a half-started or differently sized cluster: start clean
  start_munge
  write_conf
  say "starting slurmctld ($CONF)"
  slurmctld -c >"$DIR/log/slurmctld.out" 2>&1 || die "slurmctld failed: $(tail -3 "$DIR/log/slurmctld.out" "$DIR/log/slurmctld.log" 2>/dev/null)"
  local i n
  # (usually well under a second; once, in a full make check right after the packages were
  # installed, not within 10 s: wait 30, and show the log, since the tests remove DIR)
  for i in $(seq 300); do ctld_up && break; sleep 0.1; done
  ctld_up || {
    tail -n 20 "$DIR/log/slurmctld.log" >&2 2>/dev/null
    do_stop
    die "slurmctld is not UP after 30 s; see $DIR/log/slurmctld.log"
  }
  for n in $(node_names); do
    slurmd -N "$n" >"$DIR/log/slurmd-$n.out" 2>&1 ||
      { do_stop; die "slurmd -N $n failed: $(tail -3 "$DIR/log/slurmd-$n.out" "$DIR/log/slurmd-$n.log" 2>/dev/null)"; }
  done
  for i in $(seq 200); do nodes_idle && break; sleep 0.1; done
  nodes_idle || { # (once in CI: n1 stayed unk* twice in a row; show why, since the tests remove DIR)
    sinfo -N >&2
    for n in $(node_names); do tail -n 5 "$DIR/log/slurmd-$n.out" "$DIR/log/slurmd-$n.log" >&2 2>/dev/null; done
    do_stop
    die "nodes not idle after 20 s; see $DIR/log/slurmd-*.log"
  }
  say "up: $NODES nodes x 4 CPUs x 4 fake GPUs, controller port $(sed -n 's/^SlurmctldPort=//p' "$CONF")"
  echo "export SLURM_CONF=$CONF"
}

do_stop() {
  export PATH=$PATH:/usr/sbin
  local n i f
  if [ -r "$CONF" ] && alive "$RUN/slurmctld.pid" slurmctld; then
    # cancel jobs so that no slurmstepd or task outlives the cluster
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
      scancel --full $(squeue -h -o %i 2>/dev/null) 2>/dev/null
      for i in $(seq 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    fi
  fi
  for f in "$RUN"/slurmd-*.pid; do
    [ -e "$f" ] && stop_pidfile "$f" slurmd
  done
  stop_pidfile "$RUN/slurmctld.pid" slurmctld
  say "stopped (munged left running)"
}

case $cmd in
  start) do_start ;;
  stop) do_stop ;;
  status) n=$(nodes_in_conf); NODES=${n:-$NODES}; export PATH=$PATH:/usr/sbin; show_status ;;
  *) die "usage: $0 start|stop|status DIR [NODES]" ;;
esac
