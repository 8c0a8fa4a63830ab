# What the shell tests against a Ceph cluster of their own share
# (ceph_cluster_test.sh, tune_ceph_test.sh): sourced, not run.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/ceph_test_lib.sh" NAME
#
# Exits 77 (CTest's SKIP_RETURN_CODE) with the reason when Ceph is not
# installed; else sets root (the repository), cluster (scripts/ceph-cluster.sh),
# tmp (a fresh folder, removed on exit with the cluster in it) and dir (the
# cluster's folder, $tmp/cluster), and defines the checks (check, has,
# refused, each counted in passed/failed), the clients with a bounded wait
# (ceph_, rados_as) and ceph_test_start, which starts the cluster in $dir and
# exports its environment. The test ends with ceph_test_summary.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cluster="$root/scripts/ceph-cluster.sh"
passed=0
failed=0

for tool in ceph ceph-mon ceph-osd rados; do
  if ! command -v "$tool" >/dev/null; then
    echo "skipped: $tool not installed (scripts/install-deps.sh --all)"
    echo "0 passed, 0 failed"
    exit 77
  fi
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/stoker-${1:-ceph}-test.XXXXXX")"
dir="$tmp/cluster"
ceph_test_cleanup() {
  "$cluster" stop "$dir" >/dev/null 2>&1
  rm -rf -- "$tmp"
}
trap ceph_test_cleanup EXIT

log() { printf '[%3ds] %s\n' "$SECONDS" "$*"; }
pass() { passed=$((passed + 1)); log "PASS $1"; }
fail() { failed=$((failed + 1)); log "FAIL $1${2:+: $2}"; }
check() { # NAME CMD...: passes iff CMD exits 0
  local name="$1" out
  shift
  if out="$("$@" 2>&1)"; then pass "$name"; else fail "$name" "$(tail -n 5 <<<"$out")"; fi
}
has() { # NAME TEXT PATTERN: passes iff TEXT contains PATTERN (grep -E)
  if grep -qE -- "$3" <<<"$2"; then pass "$1"; else fail "$1" "no /$3/ in: $(tail -n 8 <<<"$2")"; fi
}
refused() { # NAME CMD...: passes iff CMD fails with EPERM/EACCES, not some other error
  local name="$1" out
  shift
  if out="$("$@" 2>&1)"; then
    fail "$name" "was allowed"
  elif grep -qE '\((1|13)\) (Operation not permitted|Permission denied)' <<<"$out"; then
    pass "$name"
  else
    fail "$name" "failed, but not with EPERM: $(tail -n 2 <<<"$out")"
  fi
}

# The clients run with a bounded wait, so a broken cluster fails the test
# instead of hanging it.
ceph_() { timeout 60 ceph --id admin --connect-timeout 15 "$@"; }
rados_as() { # ID ARGS...
  local id="$1"
  shift
  timeout 60 rados --id "$id" --client-mount-timeout 15 "$@"
}

ceph_test_summary() {
  echo "$passed passed, $failed failed"
  ((failed == 0))
}

# Starts the cluster in $dir and exports its environment (CEPH_CONF, ...);
# a failed start ends the test.
ceph_test_start() {
  local t0=$SECONDS exports
  log "starting a cluster in $dir"
  if ! exports="$("$cluster" start "$dir")"; then
    fail "start"
    ceph_test_summary
    exit 1
  fi
  pass "start ($((SECONDS - t0)) s)"
  eval "$exports"
}
