#!/usr/bin/env bash
# `stoker tune ceph` against a real cluster it starts in a temporary folder:
# --dry-run changes nothing; a key that may not change the cluster is refused
# with the command named and nothing applied; --apply makes the pools, CRUSH
# rules, config and job client, which `ceph osd pool get`, `ceph osd crush rule
# dump`, `ceph auth get` and `ceph config get` then show; the job client reads
# the data pool and may not write it (librados EPERM), writes checkpoints
# under its prefix only; a second --apply changes nothing; changed options
# change an existing layout; a refusal part way stops there; doctor reaches
# the cluster as the job client; checkpoints go on the fast device class.
#
#   tests/tune_ceph_test.sh STOKER_BIN     # ≈2-3 min on 2 busy cores (30 s of CPU)
#
# Last line: "N passed, N failed"; exit 1 if any failed, 77 (CTest's
# SKIP_RETURN_CODE) with the reason when Ceph is not installed.
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/ceph_test_lib.sh" tune
stoker="${1:-${STOKER_BIN:-$root/build/stoker}}"

ceph_test_start
base=("$stoker" tune ceph --conf "$CEPH_CONF" --data-pool td --ckpt-pool ck
  --gpus-per-node 4 --osd-memory-target 1073741824 --client job1 --timeout 30)
tune=("${base[@]}" --replicas 2)

# ---- dry run, and a key that may not change the cluster ----------------------

out="$("${tune[@]}" --dry-run 2>&1)"
rc=$?
check "dry-run exits 0" test "$rc" -eq 0
has "dry-run prints the rule" "$out" "osd crush rule create-replicated stoker-hdd-osd default osd hdd"
has "dry-run prints the data pool (128 PGs from 3 OSDs, 2 copies)" "$out" "osd pool create td 128 128 replicated stoker-hdd-osd"
has "dry-run prints the checkpoint pool (32 PGs)" "$out" "osd pool create ck 32 32 replicated stoker-hdd-osd"
has "dry-run prints osd_op_num_shards = 2 x 4 GPUs" "$out" "config set osd osd_op_num_shards 8"
has "dry-run prints the client's objecter bytes" "$out" "config set client.job1 objecter_inflight_op_bytes 268435456"
has "dry-run prints the job client's caps" "$out" "auth get-or-create client.job1 mon 'allow r' osd 'allow r pool=td, allow r pool=ck, allow rw pool=ck object_prefix job1/'"
check "dry-run created no pool" bash -c "! ceph --id admin osd pool ls | grep -qx td"

out="$("${tune[@]}" --id stoker-train --apply 2>&1)"
rc=$?
check "stoker-train --apply fails" test "$rc" -ne 0
has "the refusal names the command" "$out" "stoker-train.*auth get client\.(job1|stoker-train).*(EACCES|access denied)"
has "the refusal says nothing was applied" "$out" "nothing was applied"
check "nothing was applied: no pool td" bash -c "! ceph --id admin osd pool ls | grep -qx td"
check "nothing was applied: no rule" bash -c "! ceph --id admin osd crush rule ls | grep -qx stoker-hdd-osd"

# ---- apply --------------------------------------------------------------------

t0=$SECONDS
out="$("${tune[@]}" --apply 2>&1)"
rc=$?
log "apply took $((SECONDS - t0)) s"
check "apply exits 0" test "$rc" -eq 0
has "apply reports its changes" "$out" "tune ceph: [1-9][0-9]* change\(s\) applied; [0-9]+ value\(s\) read back, all as asked"
[[ $rc -eq 0 ]] || echo "$out" | tail -20

get() { ceph_ osd pool get "$1" "$2" 2>&1; }
has "td size 2" "$(get td size)" "^size: 2$"
has "td min_size 1" "$(get td min_size)" "^min_size: 1$"
has "td pg_num 128" "$(get td pg_num)" "^pg_num: 128$"
has "ck pg_num 32" "$(get ck pg_num)" "^pg_num: 32$"
has "td crush_rule" "$(get td crush_rule)" "^crush_rule: stoker-hdd-osd$"
has "ck autoscale off" "$(get ck pg_autoscale_mode)" "^pg_autoscale_mode: off$"
has "td application tag" "$(ceph_ osd pool application get td)" '"stoker_role": "data"'
has "ck application tag" "$(ceph_ osd pool application get ck)" '"stoker_role": "checkpoint"'
has "rule by device class" "$(ceph_ osd crush rule dump stoker-hdd-osd)" '"item_name": "default~hdd"'
has "rule one copy per osd" "$(ceph_ osd crush rule dump stoker-hdd-osd)" '"type": "osd"'
has "job1 caps" "$(ceph_ auth get client.job1 2>&1)" 'caps osd = "allow r pool=td, allow r pool=ck, allow rw pool=ck object_prefix job1/"'
has "config osd_op_num_shards" "$(ceph_ config get osd osd_op_num_shards)" "^8$"
has "config ms_async_op_threads" "$(ceph_ config get osd ms_async_op_threads)" "^3$"
has "config osd_memory_target" "$(ceph_ config get osd osd_memory_target)" "^1073741824$"
has "config objecter_inflight_op_bytes" "$(ceph_ config get client.job1 objecter_inflight_op_bytes)" "^268435456$"
has "config rados_osd_op_timeout" "$(ceph_ config get client.job1 rados_osd_op_timeout)" "^30$"

# ---- the job client's rights ------------------------------------------------------

out="$("${tune[@]}" --apply --keyring-out "$dir/client.job1.keyring" 2>&1)"
has "a second apply changes nothing" "$out" "tune ceph: 0 change\(s\) applied"
has "--keyring-out writes job1's key, mode 0600" "$(stat -c %a "$dir/client.job1.keyring") $(cat "$dir/client.job1.keyring")" "^600 .*\[client.job1\]"
head -c $((1 << 20)) /dev/urandom >"$tmp/data"
check "admin puts a shard into td" rados_as admin -p td put shard-0 "$tmp/data"
check "job1 reads the data pool" rados_as job1 -p td get shard-0 "$tmp/got"
check "job1 reads the right bytes" cmp "$tmp/data" "$tmp/got"
refused "job1 may not write the data pool (EPERM)" rados_as job1 -p td put evil "$tmp/data"
check "job1 writes a checkpoint under its prefix" rados_as job1 -p ck put job1/step-1 "$tmp/data"
check "job1 lists the checkpoint pool" rados_as job1 -p ck ls
refused "job1 may not write outside its prefix" rados_as job1 -p ck put job2/step-1 "$tmp/data"

# ---- a change of an existing layout (idempotence: the --keyring-out apply above) ---

out="$("${base[@]}" --replicas 3 --dry-run 2>&1)"
has "3 copies: size planned" "$out" "osd pool set td size 3"
has "3 copies: fewer PGs (64)" "$out" "osd pool set td pg_num 64"
has "3 copies: pools are not created again" "$(grep -c 'pool create' <<<"$out")" "^0$"
out="$("${base[@]}" --replicas 3 --apply 2>&1)"
has "3 copies applied and read back" "$out" "change\(s\) applied; [0-9]+ value\(s\) read back, all as asked"
has "td size 3" "$(get td size)" "^size: 3$"
has "td min_size 2" "$(get td min_size)" "^min_size: 2$"

# ---- a refusal part way: stop there, say what was applied, finish on a rerun ------

half=("$stoker" tune ceph --conf "$CEPH_CONF" --data-pool td2 --ckpt-pool ck2 --client job2
  --gpus-per-node 4 --osd-memory-target 1073741824 --timeout 30)
out="$("${half[@]}" --replicas 20 --apply 2>&1)"
rc=$?
check "20 copies: apply fails" test "$rc" -ne 0
has "the failure names the refused command" "$out" "step [0-9]+ of [0-9]+ refused: .*osd pool set td2 size 20.*EINVAL"
has "the failure says what was applied before it" "$out" "applied before it \(each whole; --apply again finishes the rest\):$"
# No class has 20 OSDs: a rule over every OSD, then the pool on it.
has "...namely the pool it created" "$out" "^  ceph .*osd pool create td2 16 16 replicated stoker-any-osd$"
check "nothing after the refusal: td2 has its default size" bash -c "ceph --id admin osd pool get td2 size | grep -qx 'size: 2'"
check "nothing after the refusal: no ck2" bash -c "! ceph --id admin osd pool ls | grep -qx ck2"
has "nothing after the refusal: job2's config untouched" "$(ceph_ config get client.job2 objecter_inflight_op_bytes)" "^104857600$"
out="$("${half[@]}" --replicas 2 --apply 2>&1)"
has "a rerun with a valid size finishes the rest" "$out" "change\(s\) applied; [0-9]+ value\(s\) read back, all as asked"

# ---- doctor reaches the cluster as the job client ------------------------------------

out="$("$stoker" doctor --only ceph-reach --ceph "rados://td?conf=$CEPH_CONF&id=job1" 2>&1)"
rc=$?
has "doctor: ceph-reach PASS" "$out" "PASS  ceph-reach +reachable; stat round trip"
check "doctor exits 0" test "$rc" -eq 0
out="$("$stoker" doctor --only ceph-reach --ceph "rados://nosuchpool?conf=$CEPH_CONF&id=job1" 2>&1)"
has "doctor: a missing pool fails, named" "$out" "FAIL  ceph-reach.*nosuchpool"

# ---- device classes: checkpoints on the fast class, when it can hold them ----------
# Last: moving an OSD to another class remaps the pools above.

ceph_ osd crush rm-device-class osd.0 >/dev/null 2>&1
ceph_ osd crush set-device-class nvme osd.0 >/dev/null 2>&1
mixed=("$stoker" tune ceph --conf "$CEPH_CONF" --data-pool td3 --ckpt-pool ck3 --client job3 --timeout 30)
# One copy: one host is enough, so one copy per host.
out="$("${mixed[@]}" --replicas 1 --dry-run 2>&1)"
has "nvme + hdd: checkpoints on nvme" "$out" "osd pool create ck3 [0-9]+ [0-9]+ replicated stoker-nvme-host"
has "nvme + hdd: data on hdd" "$out" "osd pool create td3 [0-9]+ [0-9]+ replicated stoker-hdd-host"
has "nvme + hdd: an nvme rule" "$out" "osd crush rule create-replicated stoker-nvme-host default host nvme"
out="$("${mixed[@]}" --replicas 2 --dry-run 2>&1)"
has "one nvme OSD cannot hold 2 copies: checkpoints on hdd" "$out" "osd pool create ck3 [0-9]+ [0-9]+ replicated stoker-hdd-osd"

ceph_test_summary
