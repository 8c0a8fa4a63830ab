#!/usr/bin/env bash
# Smoke test of scripts/ceph-cluster.sh against a real cluster it starts in a
# temporary folder: the clients' caps (what each may and may not do), cephx
# refusing a wrong key, a SIGKILLed OSD (reads go on; restarted, it rejoins
# and recovers the data), a SIGSTOPped OSD (marked down within the grace),
# stop cleaning up, and a second start/stop in the same folder without a mgr.
#
#   tests/ceph_cluster_test.sh        # ≈90 s on 2 cores
#
# Last line: "N passed, N failed"; exit 1 if any failed. Exit 77 (CTest's
# SKIP_RETURN_CODE) with the reason when Ceph is not installed.
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/ceph_test_lib.sh" ceph

osd_state() { ceph_ osd dump | awk -v n="osd.$1" '$1 == n { print $2 }'; } # up|down
wait_osd() { # ID STATE LIMIT_S: until osd.ID is STATE; prints the seconds it took
  local t0=$SECONDS
  until [[ "$(osd_state "$1")" == "$2" ]]; do
    ((SECONDS - t0 < $3)) || return 1
    sleep 0.2
  done
  echo $((SECONDS - t0))
}
primary_of() { # POOL OBJECT → the acting primary OSD's id
  ceph_ osd map "$1" "$2" -f json | python3 -c 'import json,sys; print(json.load(sys.stdin)["acting_primary"])'
}
acting_of() { # POOL OBJECT → the acting set, space separated
  ceph_ osd map "$1" "$2" -f json | python3 -c 'import json,sys; print(*json.load(sys.stdin)["acting"])'
}
no_daemons_left() { # no ceph process whose argv names this cluster's conf
  local p comm left=""
  for p in /proc/[0-9]*; do
    { read -r comm <"$p/comm"; } 2>/dev/null || continue
    [[ "$comm" == ceph* || "$comm" == rados* ]] || continue
    tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qxF -- "$dir/ceph.conf" && left+=" ${p#/proc/}"
  done
  [[ -z "$left" ]] || { echo "left running:$left"; return 1; }
}

# ---- start --------------------------------------------------------------------

ceph_test_start
check "start prints CEPH_CONF for eval" test "$CEPH_CONF" == "$dir/ceph.conf"
check "env file" grep -qx "export CEPH_CONF=$dir/ceph.conf" "$dir/env"
check "status answers" "$cluster" status "$dir"
check "a second start while running is refused" bash -c "! '$cluster' start '$dir'"
check "3 OSDs up" bash -c "ceph --id admin osd stat | grep -q '3 osds: 3 up.*3 in'"
for pool in training_data checkpoint; do
  check "$pool: size 2, min_size 1, app rados" bash -c \
    "ceph --id admin osd pool get $pool size | grep -qx 'size: 2' &&
     ceph --id admin osd pool get $pool min_size | grep -qx 'min_size: 1' &&
     ceph --id admin osd pool application get $pool | grep -q rados"
done

# ---- caps -----------------------------------------------------------------------

data="$tmp/data"
head -c $((4 << 20)) /dev/urandom >"$data"
check "stoker-pack puts to training_data" rados_as stoker-pack -p training_data put shard-0 "$data"
check "stoker-pack gets from training_data" rados_as stoker-pack -p training_data get shard-0 "$tmp/got-pack"
check "stoker-pack reads back the same bytes" cmp "$data" "$tmp/got-pack"
check "stoker-train gets from training_data" rados_as stoker-train -p training_data get shard-0 "$tmp/got-train"
check "stoker-train reads the same bytes" cmp "$data" "$tmp/got-train"
refused "stoker-train may not put to training_data" rados_as stoker-train -p training_data put evil "$data"
refused "stoker-train may not remove from training_data" rados_as stoker-train -p training_data rm shard-0
check "stoker-train puts to checkpoint" rados_as stoker-train -p checkpoint put ckpt-0 "$data"
check "stoker-train gets from checkpoint" rados_as stoker-train -p checkpoint get ckpt-0 "$tmp/got-ckpt"
check "checkpoint round trip is exact" cmp "$data" "$tmp/got-ckpt"
refused "stoker-pack may not read checkpoint" rados_as stoker-pack -p checkpoint get ckpt-0 "$tmp/x"
# --no-mon-config: the rados tool then reports librados' own error (EACCES)
# instead of "failed to fetch mon config".
ceph-authtool --create-keyring --gen-key -n client.stoker-pack "$tmp/wrong.keyring" >/dev/null
refused "a wrong key is refused" \
  rados_as stoker-pack --no-mon-config --keyring "$tmp/wrong.keyring" -p training_data ls
ceph-authtool --create-keyring --gen-key -n client.nobody "$tmp/nobody.keyring" >/dev/null
refused "an unknown client is refused" \
  rados_as nobody --no-mon-config --keyring "$tmp/nobody.keyring" -p training_data ls

# ---- SIGKILL one OSD ------------------------------------------------------------

for i in 1 2 3 4 5 6 7 8; do rados_as stoker-pack -p training_data put "obj-$i" "$data" || true; done
victim="$(primary_of training_data shard-0)"
read -r -a acting <<<"$(acting_of training_data shard-0)"
peer="${acting[1]:-}"
log "shard-0 lives on osd.${acting[*]}; SIGKILL its primary osd.$victim"
kill -KILL "$("$cluster" osd-pid "$victim" "$dir")"
t0=$SECONDS
check "get after SIGKILL of the primary" rados_as stoker-train -p training_data get shard-0 "$tmp/got-kill"
check "the bytes are right after the kill" cmp "$data" "$tmp/got-kill"
log "that read took $((SECONDS - t0)) s"
if secs="$(wait_osd "$victim" down 30)"; then pass "killed osd.$victim marked down (${secs} s)"; else fail "killed osd.$victim marked down"; fi
check "every object readable with osd.$victim dead" bash -c \
  "for i in 1 2 3 4 5 6 7 8; do timeout 60 rados --id stoker-train -p training_data get obj-\$i '$tmp/o' && cmp -s '$data' '$tmp/o' || exit 1; done"
check "restart-osd $victim" "$cluster" restart-osd "$victim" "$dir"
check "osd.$victim is up again" test "$(osd_state "$victim")" == up
check "recovery completes (wait-clean)" "$cluster" wait-clean "$dir"
# The restarted OSD came back empty (memstore); with its peer now killed, the
# object can only be read if recovery really copied it back.
if [[ -n "$peer" ]]; then
  log "SIGKILL osd.$peer, the other copy of shard-0"
  kill -KILL "$("$cluster" osd-pid "$peer" "$dir")"
  check "osd.$victim serves shard-0 after recovery" rados_as stoker-train -p training_data get shard-0 "$tmp/got-rec"
  check "the recovered bytes are right" cmp "$data" "$tmp/got-rec"
  check "restart-osd $peer" "$cluster" restart-osd "$peer" "$dir"
  check "recovery completes again" "$cluster" wait-clean "$dir"
else
  fail "shard-0 has a second copy"
fi

# ---- SIGSTOP one OSD ------------------------------------------------------------

hung=0
[[ "$hung" != "$victim" ]] || hung=1
pid="$("$cluster" osd-pid "$hung" "$dir")"
log "SIGSTOP osd.$hung (pid $pid)"
kill -STOP "$pid"
if secs="$(wait_osd "$hung" down 30)"; then pass "hung osd.$hung marked down (${secs} s)"; else fail "hung osd.$hung marked down within 30 s"; fi
check "get while osd.$hung hangs" rados_as stoker-train -p training_data get shard-0 "$tmp/got-hung"
kill -CONT "$pid"
if secs="$(wait_osd "$hung" up 60)"; then pass "resumed osd.$hung back up (${secs} s)"; else fail "resumed osd.$hung back up"; fi
check "clean again" "$cluster" wait-clean "$dir"

# ---- stop, and again without a mgr ------------------------------------------------

check "stop" "$cluster" stop "$dir"
check "no daemon of this cluster is left" no_daemons_left
check "DIR is gone" test ! -e "$dir"
check "stop again is a no-op" "$cluster" stop "$dir"
check "status of a stopped cluster fails" bash -c "! '$cluster' status '$dir'"

log "second start in the same folder, without a mgr"
t0=$SECONDS
if exports="$(STOKER_CEPH_MGR=0 "$cluster" start "$dir")"; then
  pass "second start, no mgr ($((SECONDS - t0)) s)"
  eval "$exports"
  check "no mgr: stoker-pack puts" rados_as stoker-pack -p training_data put again "$data"
  check "no mgr: stoker-train reads it" rados_as stoker-train -p training_data get again "$tmp/got-again"
  check "stop after the second start" "$cluster" stop "$dir"
  check "no daemon left after the second stop" no_daemons_left
  check "DIR is gone after the second stop" test ! -e "$dir"
else
  fail "second start, no mgr"
fi

ceph_test_summary
