#!/usr/bin/env bash
# ceph-cluster.sh — a real single-host Ceph cluster on 127.0.0.1, in one folder.
#
# For stoker's tests, CI, benchmarks, and anyone trying stoker against RADOS:
# one monitor, one mgr (if ceph-mgr is installed), three OSDs, cephx on, two
# pools and two least-privilege clients. Everything it writes (data, keys,
# logs, sockets, pid files) stays under DIR; /etc/ceph is never read or written.
#
# Usage:
#   scripts/ceph-cluster.sh start [DIR]          start it (≈15 s); prints the exports
#   scripts/ceph-cluster.sh stop [DIR]           kill its daemons, remove DIR (idempotent)
#   scripts/ceph-cluster.sh status [DIR]         `ceph -s` and the daemons' pids;
#                                                exit 0 iff the cluster answers
#   scripts/ceph-cluster.sh osd-pid N [DIR]      print osd.N's pid (exit 1 if not running)
#   scripts/ceph-cluster.sh restart-osd N [DIR]  start osd.N again (SIGKILLing it first
#                                                if it runs); returns once it is up
#   scripts/ceph-cluster.sh wait-clean [DIR]     wait until all OSDs are up and every
#                                                PG is active+clean (recovery done)
#
#   eval "$(scripts/ceph-cluster.sh start)"      # exports CEPH_CONF, STOKER_CEPH_DIR
#   rados --id stoker-pack -p training_data put obj ./file
#   scripts/ceph-cluster.sh stop
#
# DIR defaults to $STOKER_CEPH_DIR, else /tmp/stoker-ceph. `start` prints only
# the export lines on stdout (after a comment naming the conf); progress and
# errors go to stderr. DIR/env holds the same export lines.
#
# What `start` makes:
#   pools    training_data, checkpoint: replicated, size 2, min_size 1,
#            32 PGs each, application "rados"
#   clients  client.stoker-pack   read/write training_data
#            client.stoker-train  read training_data, read/write checkpoint
#            client.admin         everything
#            Keys are in DIR/client.NAME.keyring and ceph.conf says
#            `keyring = DIR/$name.keyring`, so `--id NAME` is all a client needs.
#   OSDs     osd.0-2 on memstore (why: see below). A killed OSD is marked down
#            at once, a hung (SIGSTOPped) one after the 6 s heartbeat grace; no
#            OSD is ever marked out, so nothing rebalances mid-test.
#
# Faults, for tests:
#   kill -9 "$(scripts/ceph-cluster.sh osd-pid 1)"; scripts/ceph-cluster.sh restart-osd 1
#   kill -STOP "$(scripts/ceph-cluster.sh osd-pid 1)" ... kill -CONT ...
#   scripts/ceph-cluster.sh wait-clean   # before the next fault: with 2 copies,
#                                        # a second kill before recovery loses data
#
# Environment:
#   STOKER_CEPH_DIR          default DIR.
#   STOKER_CEPH_PORT         monitor port (msgr v2). Default: 6789, or the next
#                            free one up to 6888.
#   STOKER_CEPH_OSD_BYTES    capacity of each OSD, in bytes or like 4G. Default:
#                            2G. Memstore keeps data in RAM, so 3 OSDs x 2 GiB =
#                            6 GiB of RAM at most, holding about 2.5 GiB of data
#                            at 2 copies: writes block once any OSD is 95% full.
#                            A 10 s `rados bench write` wants 4G.
#   STOKER_CEPH_OBJECTSTORE  memstore (default) or bluestore (on a sparse file
#                            DIR/osd.N/block: data survives restarts and goes
#                            through a real disk, for benchmarks; mkfs is slower).
#   STOKER_CEPH_MGR=0        no mgr: starts faster, pools work, but nothing
#                            reports PG states (`ceph -s` shows them unknown,
#                            `ceph df` hangs), so `start` and `wait-clean` wait
#                            for the OSDs and then for a write to each pool.
#   STOKER_CEPH_TIMEOUT      seconds to wait for OSDs and PGs. Default: 120.
#   STOKER_CEPH_KEEP=1       `stop`, and a failed `start`, keep DIR and its logs.
#
# Why memstore: a memstore OSD that is SIGKILLed loses its data, but restarted
# with `restart-osd` it rejoins empty and recovers from the other copy in
# seconds (tests/ceph_cluster_test.sh checks it by then killing that other
# copy), which is all a fault-injection test needs. It formats instantly
# (bluestore: ~3 s per OSD), uses no disk, and on 2 cores it is 2-3x faster
# than bluestore, which spends the CPU on RocksDB. Bluestore is there for when
# the disk path matters or data must survive a restart of every OSD.
set -euo pipefail

readonly kNumOsds=3
readonly kPgNum=32 # per pool: 2 pools x 32 PGs x 2 copies / 3 OSDs ≈ 43 PGs per OSD
readonly kPools=(training_data checkpoint)
readonly kMonId=a
# The address every daemon listens on. Default 127.0.0.1; scripts/two-nodes.sh
# sets a veth address inside a network namespace of its own.
readonly kAddr=${STOKER_CEPH_ADDR:-127.0.0.1}
readonly kMgrId=x
readonly kMarker=.stoker-ceph-cluster # `stop` removes only a folder holding it
timeout_s="${STOKER_CEPH_TIMEOUT:-120}"

say() { printf 'ceph-cluster: [%3ds] %s\n' "$SECONDS" "$*" >&2; }
die() { say "error: $*"; exit 1; }

usage() { # [EXIT_CODE]: prints the header comment
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit "${1:-2}"
}

set_dir() {
  local d="${1:-${STOKER_CEPH_DIR:-/tmp/stoker-ceph}}"
  [[ -n "$d" ]] || die "empty DIR"
  dir="$(realpath -m -- "$d")"
  [[ "$dir" != "/" ]] || die "refusing to use / as DIR"
  conf="$dir/ceph.conf"
}

# The ceph CLI as this cluster's client.admin, bounded so that a dead or hung
# monitor fails the command instead of hanging the script.
ceph_() {
  timeout 60 ceph --conf "$conf" --name client.admin --connect-timeout 20 "$@"
}

# ---- processes --------------------------------------------------------------

# Prints "PID NAME" (NAME: mon.a, osd.1, ...) for each live daemon started with
# this DIR's conf. Found by the exact conf path in argv rather than by pid
# file, so a pid that was reused, or a daemon whose pid file is gone, is never
# a problem and no other cluster is touched. Zombies have no argv: skipped.
daemon_pids() {
  local p comm args i ours
  for p in /proc/[0-9]*; do
    { read -r comm <"$p/comm"; } 2>/dev/null || continue
    case "$comm" in ceph-mon | ceph-mgr | ceph-osd) ;; *) continue ;; esac
    { mapfile -d '' args <"$p/cmdline"; } 2>/dev/null || continue
    ours=0
    for ((i = 1; i < ${#args[@]}; i++)); do [[ "${args[i]}" != "$conf" ]] || ours=1; done
    ((ours)) || continue
    for ((i = 1; i + 1 < ${#args[@]}; i++)); do
      [[ "${args[i]}" != -i ]] || echo "${p#/proc/} ${comm#ceph-}.${args[i + 1]}"
    done
  done
}

pid_of() { daemon_pids | awk -v n="$1" '$2 == n { print $1 }'; } # NAME → pid

proc_state() { awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null || echo gone; }

wait_gone() { # PID...: until each has exited (or is a zombie nobody reaped)
  local pid deadline=$((SECONDS + 30))
  for pid in "$@"; do
    while [[ -e /proc/$pid && "$(proc_state "$pid")" != Z ]]; do
      ((SECONDS < deadline)) || die "pid $pid still alive 30 s after SIGKILL"
      sleep 0.1
    done
  done
}

# SIGKILL, not SIGTERM: the data is thrown away anyway, a clean memstore
# shutdown would first write every object to disk, and SIGKILL also ends a
# SIGSTOPped daemon.
kill_daemons() {
  local pids=() pid name
  while read -r pid name; do
    say "killing $name (pid $pid)"
    pids+=("$pid")
  done < <(daemon_pids)
  ((${#pids[@]})) || return 0
  kill -KILL "${pids[@]}" 2>/dev/null || true
  wait_gone "${pids[@]}"
}

# Daemons fork into the background by themselves; `ceph-X -i ID` returns once
# the daemon has initialised (an OSD takes ~2 s: several start in parallel).
# Their stderr chatter goes to DIR/log/daemons.log.
start_daemons() { # TYPE ID...
  local type="$1" id pids=() p rc=0
  shift
  for id in "$@"; do
    "ceph-$type" --conf "$conf" -i "$id" </dev/null >>"$dir/log/daemons.log" 2>&1 9<&- &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  ((rc == 0)) || die "ceph-$type $* did not start (exit $rc); see $dir/log"
}

log_tails() {
  local f
  for f in "$dir"/log/*.log; do
    [[ -s "$f" ]] || continue
    printf '\n==> %s (last 15 lines) <==\n' "$f" >&2
    tail -n 15 "$f" >&2
  done
}

# ---- waiting ------------------------------------------------------------------

# Reads `ceph status -f json`; exit 0 iff all NUM_OSDS are up and in and every
# PG (at least MIN_PGS of them) is active+clean (+scrubbing and such is fine).
readonly kReadyPy='
import json, sys
s = json.load(sys.stdin)
o, p = s["osdmap"], s["pgmap"]
o = o.get("osdmap", o)
clean = sum(x["count"] for x in p.get("pgs_by_state", [])
            if x["state_name"] == "active+clean" or x["state_name"].startswith("active+clean+"))
ok = o["num_osds"] == o["num_up_osds"] == o["num_in_osds"] == int(sys.argv[1]) \
    and p["num_pgs"] >= int(sys.argv[2]) and clean == p["num_pgs"]
sys.exit(0 if ok else 1)
'

# Until all OSDs are up and in and every PG active+clean, or die after the
# timeout. Without a mgr nobody reports PG states, so it waits for the OSDs and
# then for a write to each pool to succeed.
wait_clean() {
  local deadline=$((SECONDS + timeout_s)) next_report=$((SECONDS + 10)) pool
  local rados_=(timeout 10 rados --conf "$conf" --name client.admin)
  if [[ -n "$(pid_of "mgr.$kMgrId")" ]]; then
    until ceph_ status -f json 2>/dev/null |
      python3 -c "$kReadyPy" "$kNumOsds" $((kPgNum * ${#kPools[@]})); do
      if ((SECONDS >= deadline)); then
        ceph_ status >&2 || true
        die "not all OSDs up and PGs active+clean after $timeout_s s"
      fi
      if ((SECONDS >= next_report)); then
        say "still waiting: $(ceph_ pg stat 2>&1 | cut -c1-150)"
        next_report=$((SECONDS + 10))
      fi
      sleep 0.5
    done
    return
  fi
  until ceph_ osd stat 2>/dev/null | grep -q "^$kNumOsds osds: $kNumOsds up.*, $kNumOsds in"; do
    ((SECONDS < deadline)) || { ceph_ osd tree >&2 || true; die "OSDs not up after $timeout_s s"; }
    sleep 0.5
  done
  for pool in "${kPools[@]}"; do
    until echo probe | "${rados_[@]}" -p "$pool" put .probe - 2>>"$dir/log/setup.log" &&
      "${rados_[@]}" -p "$pool" rm .probe 2>>"$dir/log/setup.log"; do
      ((SECONDS < deadline)) || die "pool $pool not writable after $timeout_s s"
      sleep 0.5
    done
  done
}

wait_osd_up() { # ID
  local deadline=$((SECONDS + timeout_s))
  until [[ "$(ceph_ osd dump 2>/dev/null | awk -v n="osd.$1" '$1 == n { print $2 }')" == up ]]; do
    ((SECONDS < deadline)) || die "osd.$1 not up after $timeout_s s; see $dir/log/osd.$1.log"
    sleep 0.5
  done
}

# ---- start ------------------------------------------------------------------

port_in_use() {
  if command -v ss >/dev/null; then
    [[ -n "$(ss -Htln "sport = :$1" 2>/dev/null)" ]]
  else
    (exec 3<>"/dev/tcp/$kAddr/$1") 2>/dev/null
  fi
}

pick_port() {
  local p
  if [[ -n "${STOKER_CEPH_PORT:-}" ]]; then
    ! port_in_use "$STOKER_CEPH_PORT" || die "STOKER_CEPH_PORT=$STOKER_CEPH_PORT is in use"
    echo "$STOKER_CEPH_PORT"
    return
  fi
  for ((p = 6789; p <= 6888; p++)); do
    port_in_use "$p" || { echo "$p"; return; }
  done
  die "no free port in 6789-6888; set STOKER_CEPH_PORT"
}

objectstore_conf() { # the [osd] lines that depend on the objectstore
  local bytes="${STOKER_CEPH_OSD_BYTES:-$((2 << 30))}"
  case "${STOKER_CEPH_OBJECTSTORE:-memstore}" in
    memstore)
      printf '%s\n' "osd objectstore = memstore" "memstore device bytes = $bytes"
      ;;
    bluestore)
      printf '%s\n' "osd objectstore = bluestore" \
        "# A sparse file per OSD, DIR/osd.N/block; DB and WAL share it." \
        "bluestore block create = true" "bluestore block size = $bytes" \
        "bluestore fsck on mkfs = false" \
        "# Default 4 GiB each; the minimum leaves RAM to the client." \
        "osd memory target = 939524096"
      ;;
    *) die "STOKER_CEPH_OBJECTSTORE must be memstore or bluestore" ;;
  esac
}

write_conf() { # FSID PORT
  local osd_lines
  osd_lines="$(objectstore_conf)"
  cat >"$conf" <<EOF
# Written by stoker's scripts/ceph-cluster.sh: a throwaway test cluster.
#   CEPH_CONF=$conf rados --id stoker-pack -p training_data ls
[global]
fsid = $1
mon host = v2:$kAddr:$2
public addr = $kAddr
cluster addr = $kAddr
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
# Every file stays in this folder.
keyring = $dir/\$name.keyring
run dir = $dir/run
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
mon cluster log file = $dir/log/cluster.log
crash dir = $dir/crash
# One host: the copies go to different OSDs, not different hosts.
osd crush chooseleaf type = 0
osd pool default size = 2
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool delete = true
mon warn on pool no redundancy = false
# Test folders live on shared disks: no warning at 30% free, no stop at 5%.
mon data avail warn = 5
mon data avail crit = 1
# Failure detection in seconds: a killed OSD is marked down at once (its
# peers see the refused connection), a hung one after the grace. The OSDs
# share one host, so each must count as a reporter on its own.
osd heartbeat interval = 1
osd heartbeat grace = 6
mon osd adjust heartbeat grace = false
mon osd min down reporters = 1
mon osd reporter subtree level = osd
# Never mark an OSD out: no rebalancing mid-test; a restarted OSD just rejoins.
mon osd down out interval = 3600
# PG states reach \`ceph status\` within a second (default 5 s).
mgr stats period = 1
mon mgr digest period = 1
# The mgr imports every module it finds before it becomes active (10-15 s on
# 2 busy cores); skip the ones a test cluster has no use for.
mgr initial modules = iostat
mgr disabled modules = alerts cephadm dashboard diskprediction_local influx insights k8sevents localpool mirroring nfs osd_perf_query osd_support restful rook selftest snap_schedule stats telegraf test_orchestrator zabbix

[client]
# One socket per process, so concurrent clients do not fight over a name.
admin socket = $dir/run/\$name.\$pid.asok
# An op sent to an OSD that has just died waits until the client asks for a
# new OSD map: after objecter timeout + tick (10 + 5 s by default, 2 + 1 s here).
objecter timeout = 2
objecter tick interval = 1

[mon]
mon data = $dir/mon.\$id
keyring = $dir/mon.\$id/keyring

[mgr]
mgr data = $dir/mgr.\$id
keyring = $dir/mgr.\$id/keyring

[osd]
osd data = $dir/osd.\$id
osd journal = $dir/osd.\$id/journal
keyring = $dir/osd.\$id/keyring
# Memstore OSDs count as hdd, whose recovery sleeps 0.1 s per object: a
# restarted OSD would take minutes to get its copies back.
osd recovery sleep hdd = 0
osd recovery max active hdd = 16
# Peers report an OSD's failure every 5 s by default; at 1 s a hung OSD is
# marked down close to the heartbeat grace.
osd mon report interval = 1
$osd_lines
EOF
}

new_key() { # NAME FILE CAPS...: a keyring holding a new key for NAME
  local name="$1" file="$2"
  shift 2
  ceph-authtool --create-keyring --gen-key -n "$name" "$file" "$@" >/dev/null
}

# Client and mgr keys, with their caps, are made offline and imported by
# `ceph-mon --mkfs`, so they exist from the monitor's first second.
make_keys() {
  local f
  new_key mon. "$dir/mon.keyring" --cap mon 'allow *'
  new_key client.admin "$dir/client.admin.keyring" \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *'
  new_key client.stoker-pack "$dir/client.stoker-pack.keyring" \
    --cap mon 'allow r' --cap osd 'allow rw pool=training_data'
  new_key client.stoker-train "$dir/client.stoker-train.keyring" \
    --cap mon 'allow r' --cap osd 'allow r pool=training_data, allow rw pool=checkpoint'
  new_key "mgr.$kMgrId" "$dir/mgr.$kMgrId/keyring" \
    --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *'
  for f in "$dir"/client.*.keyring "$dir/mgr.$kMgrId/keyring"; do
    ceph-authtool "$dir/mon.keyring" --import-keyring "$f" >/dev/null
  done
}

start_mon() { # PORT
  monmaptool --create --clobber --fsid "$fsid" --addv "$kMonId" "[v2:$kAddr:$1]" \
    "$dir/monmap" >/dev/null
  ceph-mon --conf "$conf" -i "$kMonId" --mkfs --monmap "$dir/monmap" \
    --keyring "$dir/mon.keyring" 2>>"$dir/log/setup.log"
  start_daemons mon "$kMonId"
  ceph_ mon stat >/dev/null || die "the monitor on $kAddr:$1 does not answer"
}

# `ceph osd new` allocates the id, `ceph-osd --mkfs --mkkey` formats the store
# and writes the OSD's key (not registered yet, hence --no-mon-config), and
# `ceph auth add` registers it with the OSD's caps.
make_osd() {
  local uuid id
  uuid="$(uuidgen)"
  id="$(ceph_ osd new "$uuid")"
  mkdir -p "$dir/osd.$id"
  ceph-osd --conf "$conf" -i "$id" --mkfs --mkkey --osd-uuid "$uuid" --no-mon-config \
    2>>"$dir/log/setup.log"
  ceph_ auth add "osd.$id" osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
    -i "$dir/osd.$id/keyring" 2>>"$dir/log/setup.log"
}

on_start_exit() {
  local rc=$? i
  ((rc)) || return 0
  if ((rc == 130 || rc == 143)); then
    say "interrupted; stopping what was started"
  else
    say "start failed (exit $rc); the logs' last lines follow"
    log_tails
  fi
  # Daemons still being launched in the background daemonise within seconds;
  # let them, so that none is left behind.
  for ((i = 0; i < 100 && $(jobs -pr | wc -l) > 0; i++)); do sleep 0.1; done
  kill_daemons || true
  if [[ "${STOKER_CEPH_KEEP:-0}" == 1 ]]; then say "kept $dir"; else rm -rf -- "$dir"; fi
  exit "$rc"
}

cmd_start() {
  local t0=$SECONDS port pool tool i osds_job mgr_job=""
  for tool in ceph ceph-mon ceph-osd ceph-authtool monmaptool rados uuidgen python3 realpath; do
    command -v "$tool" >/dev/null || die "$tool not found (scripts/install-deps.sh --all installs Ceph)"
  done
  if [[ -e "$dir" ]]; then
    [[ -z "$(daemon_pids)" ]] || die "a cluster is already running in $dir; stop it first"
    if [[ -e "$dir/$kMarker" ]]; then
      rm -rf -- "$dir" # what a `stop` with STOKER_CEPH_KEEP=1 left
    elif [[ -n "$(ls -A -- "$dir")" ]]; then
      die "$dir exists and was not made by this script; pick another DIR"
    fi
  fi
  objectstore_conf >/dev/null # validates STOKER_CEPH_OBJECTSTORE before anything is made
  mkdir -p "$dir/log" "$dir/run" "$dir/crash" "$dir/mon.$kMonId" "$dir/mgr.$kMgrId"
  touch "$dir/$kMarker"
  trap on_start_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  fsid="$(uuidgen)"
  make_keys
  # Two clusters starting at once (parallel CI jobs) must not both pick the
  # same free port: hold a lock on this script from the pick until the
  # monitor listens. The daemons are started with the lock's fd closed.
  exec 9<"${BASH_SOURCE[0]}"
  command -v flock >/dev/null && flock 9
  port="$(pick_port)"
  write_conf "$fsid" "$port"
  say "starting mon.$kMonId on $kAddr:$port (msgr v2) in $dir"
  start_mon "$port"
  exec 9<&-
  if [[ "${STOKER_CEPH_MGR:-1}" != 0 ]] && command -v ceph-mgr >/dev/null; then
    start_daemons mgr "$kMgrId" &
    mgr_job=$!
  fi
  say "creating $kNumOsds OSDs (${STOKER_CEPH_OBJECTSTORE:-memstore})"
  for ((i = 0; i < kNumOsds; i++)); do make_osd; done
  say "starting the OSDs${mgr_job:+ and mgr.$kMgrId}; creating pools ${kPools[*]}"
  start_daemons osd $(seq 0 $((kNumOsds - 1))) &
  osds_job=$!
  for pool in "${kPools[@]}"; do
    ceph_ osd pool create "$pool" "$kPgNum" "$kPgNum" replicated 2>>"$dir/log/setup.log"
    ceph_ osd pool application enable "$pool" rados >/dev/null 2>>"$dir/log/setup.log"
  done
  wait "$osds_job" || die "the OSDs did not start"
  [[ -z "$mgr_job" ]] || wait "$mgr_job" || die "the mgr did not start"
  say "waiting for $kNumOsds OSDs up and in, and every PG active+clean"
  wait_clean

  printf 'export CEPH_CONF=%q\nexport STOKER_CEPH_DIR=%q\n' "$conf" "$dir" >"$dir/env"
  trap - EXIT INT TERM
  say "ready in $((SECONDS - t0)) s; clients: --id stoker-pack, --id stoker-train, --id admin"
  echo "# $conf"
  cat "$dir/env"
}

# ---- other commands ---------------------------------------------------------

cmd_stop() {
  [[ -e "$dir" ]] || return 0
  [[ -e "$dir/$kMarker" ]] || die "$dir was not made by this script; not touching it"
  kill_daemons
  if [[ "${STOKER_CEPH_KEEP:-0}" == 1 ]]; then
    say "stopped; kept $dir"
  else
    rm -rf -- "$dir"
    say "stopped; removed $dir"
  fi
}

cmd_status() {
  local pid name rc=0
  [[ -e "$conf" ]] || die "no cluster in $dir"
  timeout 30 ceph --conf "$conf" --name client.admin --connect-timeout 10 status || rc=$?
  echo "daemons:"
  while read -r pid name; do
    echo "  $name pid $pid state $(proc_state "$pid")"
  done < <(daemon_pids | sort -k2)
  return "$rc"
}

cmd_osd_pid() { # ID
  local pid
  pid="$(pid_of "osd.$1")"
  [[ -n "$pid" ]] || die "osd.$1 is not running in $dir"
  echo "$pid"
}

cmd_restart_osd() { # ID
  local id="$1" pid
  [[ -e "$dir/osd.$id/keyring" ]] || die "no osd.$id in $dir"
  pid="$(pid_of "osd.$id")"
  if [[ -n "$pid" ]]; then
    say "osd.$id runs (pid $pid, state $(proc_state "$pid")); SIGKILL first"
    kill -KILL "$pid"
    wait_gone "$pid"
  fi
  start_daemons osd "$id"
  wait_osd_up "$id"
  say "osd.$id is up (pid $(pid_of "osd.$id")); recovery goes on in the background"
}

main() {
  local cmd="${1:-}"
  shift || true
  case "$cmd" in
    start | stop | status | wait-clean)
      (($# <= 1)) || usage
      set_dir "${1:-}"
      case "$cmd" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        wait-clean)
          [[ -e "$conf" ]] || die "no cluster in $dir"
          wait_clean
          ;;
      esac
      ;;
    osd-pid | restart-osd)
      if [[ ! "${1:-}" =~ ^[0-9]+$ ]] || (($# > 2)); then usage; fi
      set_dir "${2:-}"
      if [[ "$cmd" == osd-pid ]]; then cmd_osd_pid "$1"; else cmd_restart_osd "$1"; fi
      ;;
    -h | --help | help) usage 0 ;;
    *) usage ;;
  esac
}

main "$@"
