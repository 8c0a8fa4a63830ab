#!/usr/bin/env bash
# stoker installed the ordinary ways, end to end:
#   1. `cmake --install` into a temporary prefix, and again over an older copy
#   2. a C++ consumer through find_package(stoker) (shared and static) and
#      through pkg-config (shared and static)
#   3. components: every built one can be asked for; one not built, or
#      unknown, fails at configure time naming it
#   4. /usr/bin/python3 imports the installed package with the build folder
#      hidden (a private mount namespace puts an empty tmpfs over it)
#   5. bash completion and `stoker --version`
#   6. the Debian packages (scripts/package.sh) in a fresh Debian 12 root
#      made by debootstrap (cached under /var/cache/stoker-test): an older
#      version installed, then this one over it with apt-get, then a dataset
#      packed and loaded there by the installed command and Python package.
#
#   install_test.sh BUILD_DIR
# Environment: STOKER_INSTALL_TEST_DEB=0 skips part 6 (it needs root, the
# network to Debian's mirror and debootstrap); it is on by default.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d /tmp/stoker-install-test.XXXXXX)
chroot_dir=""
cleanup() {
  if [[ -n "$chroot_dir" ]]; then
    umount "$chroot_dir/var/cache/apt/archives" 2>/dev/null || true
    umount "$chroot_dir/proc" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
step() { echo "---- $* ($(date +%T))"; }
fail() {
  echo "install_test: FAILED: $*" >&2
  exit 1
}

python_built=0
grep -q '^STOKER_WITH_PYTHON:BOOL=ON' "$build/CMakeCache.txt" && python_built=1

# ---- 1. cmake --install, twice ---------------------------------------------
step "cmake --install into $tmp/prefix"
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
pc=$(find "$prefix" -name stoker.pc | head -1)
[[ -n "$pc" ]] || fail "no stoker.pc installed"
libdir=$(sed -n 's/^libdir=\${prefix}\///p' "$pc")
for f in bin/stoker include/stoker/store.h "$libdir/libstoker.a" "$libdir/libstoker.so" \
  "$libdir/libstoker.so.0" "$libdir/cmake/stoker/stokerConfig.cmake" \
  share/bash-completion/completions/stoker; do
  [[ -e "$prefix/$f" ]] || fail "cmake --install did not install $f"
done
soname=$(readelf -d "$prefix/$libdir/libstoker.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[[ "$soname" == "libstoker.so.0" ]] || fail "libstoker.so's SONAME is '$soname', not libstoker.so.0"
# Only the public headers.
if find "$prefix/include" -type f | grep -v '/include/stoker/[a-z_0-9]*\.h$'; then
  fail "files other than include/stoker/*.h were installed under include/"
fi
# An older install in place (other content, older time): the next install
# replaces it.
cp "$prefix/bin/stoker" "$tmp/stoker.installed"
cp "$prefix/$libdir/libstoker.so.0" "$tmp/libstoker.installed"
echo "old stoker" >"$prefix/bin/stoker"
echo "old libstoker" >"$prefix/$libdir/libstoker.so.0"
touch -d '2020-01-01' "$prefix/bin/stoker" "$prefix/$libdir/libstoker.so.0"
cmake --install "$build" --prefix "$prefix" >"$tmp/install2.log"
cmp -s "$tmp/stoker.installed" "$prefix/bin/stoker" || fail "a second install did not replace an older bin/stoker"
cmp -s "$tmp/libstoker.installed" "$prefix/$libdir/libstoker.so.0" ||
  fail "a second install did not replace an older libstoker.so.0"

# ---- 2. consumers --------------------------------------------------------------
consumer_src=$src/tests/install/consumer
step "find_package(stoker) consumer, shared and static"
for link in stoker::stoker stoker::stoker_static; do
  b=$tmp/consumer-${link#stoker::}
  cmake -S "$consumer_src" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" -DSTOKER_LINK="$link" \
    -DCMAKE_BUILD_TYPE=Release >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "configure of the $link consumer"; }
  cmake --build "$b" >>"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "build of the $link consumer"; }
  "$b/consumer" "$b/work" || fail "the $link consumer did not run"
done
# The shared consumer runs on the installed libstoker, the static one on none.
# (ldd's output taken whole first: grep -q would end the pipe early, and
# pipefail would report ldd's SIGPIPE as a failure.)
deps=$(ldd "$tmp/consumer-stoker/consumer")
grep -q "$prefix/$libdir/libstoker.so.0" <<<"$deps" ||
  fail "the find_package consumer does not load $prefix/$libdir/libstoker.so.0"
deps=$(ldd "$tmp/consumer-stoker_static/consumer")
if grep -q libstoker <<<"$deps"; then
  fail "the static consumer loads libstoker.so"
fi

step "pkg-config consumer, shared and static"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
pkg-config --exists stoker || fail "pkg-config does not find stoker.pc"
[[ "$(pkg-config --modversion stoker)" == "$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")" ]] ||
  fail "stoker.pc's version is not the project's"
# shellcheck disable=SC2046
c++ -O1 -o "$tmp/pc-shared" "$consumer_src/main.cc" $(pkg-config --cflags --libs stoker) \
  -Wl,-rpath,"$prefix/$libdir" || fail "pkg-config shared consumer does not build"
"$tmp/pc-shared" "$tmp/pc-shared-work" || fail "pkg-config shared consumer does not run"
# Static: the archive itself, and Libs.private for what it needs.
static_libs=$(pkg-config --static --libs stoker | sed "s|-lstoker\b|$prefix/$libdir/libstoker.a|")
# shellcheck disable=SC2086
c++ -O1 -o "$tmp/pc-static" "$consumer_src/main.cc" $(pkg-config --cflags stoker) $static_libs ||
  fail "pkg-config static consumer does not build (Libs.private: $static_libs)"
"$tmp/pc-static" "$tmp/pc-static-work" || fail "pkg-config static consumer does not run"
unset PKG_CONFIG_PATH

# ---- 3. components --------------------------------------------------------------
step "find_package(stoker COMPONENTS ...)"
built=$(sed -n 's/^set(stoker_BUILT_COMPONENTS \(.*\))$/\1/p' "$prefix/$libdir/cmake/stoker/stokerConfig.cmake")
echo "built components: ${built:-none}"
# find_package only (no build): a project of one line.
probe() { # probe PREFIX COMPONENTS -> configure output in $tmp/probe.log, status
  mkdir -p "$tmp/probe"
  printf 'cmake_minimum_required(VERSION 3.16)\nproject(p CXX)\nfind_package(stoker CONFIG REQUIRED COMPONENTS %s)\n' "$2" \
    >"$tmp/probe/CMakeLists.txt"
  rm -rf "$tmp/probe/b"
  cmake -S "$tmp/probe" -B "$tmp/probe/b" -DCMAKE_PREFIX_PATH="$1" >"$tmp/probe.log" 2>&1
}
if [[ -n "$built" ]]; then
  probe "$prefix" "$built" || { cat "$tmp/probe.log"; fail "asking for the built components ($built) failed"; }
fi
# CMake wraps the package's message: compare with the lines joined.
said() { grep -qF "$1" <<<"$(tr -s ' \n' '  ' <"$tmp/probe.log")"; }
probe "$prefix" "nosuchpart" && fail "an unknown component was accepted"
said "no component 'nosuchpart'" || { cat "$tmp/probe.log"; fail "no message naming the unknown component"; }
# A component not built: one this build lacks, else the same package with
# rados taken out of its built list (as a build without RADOS writes it).
missing=""
for part in rados io_uring turbojpeg mpi cuda python; do
  [[ " $built " == *" $part "* ]] || { missing=$part; break; }
done
probe_prefix=$prefix
if [[ -z "$missing" ]]; then
  missing=rados
  probe_prefix=$tmp/prefix-without-rados
  mkdir -p "$probe_prefix/$libdir/cmake"
  cp -r "$prefix/$libdir/cmake/stoker" "$probe_prefix/$libdir/cmake/"
  sed -i 's/^set(stoker_BUILT_COMPONENTS \(.*\)rados\(.*\))$/set(stoker_BUILT_COMPONENTS \1\2)/' \
    "$probe_prefix/$libdir/cmake/stoker/stokerConfig.cmake"
fi
probe "$probe_prefix" "$missing" && fail "component $missing, not built, was accepted"
said "built without component(s) $missing" ||
  { cat "$tmp/probe.log"; fail "no message naming the component $missing"; }

# ---- 4. Python, without the build folder ------------------------------------------
if ((python_built)); then
  step "/usr/bin/python3 -c 'import stoker' from the prefix, build folder hidden"
  pydir=$prefix/lib/python3/dist-packages
  ext=$(ls "$pydir"/stoker/_stoker*.so)
  rpath=$(readelf -d "$ext" | grep -E 'R(UN)?PATH' || true)
  if grep -q "$build" <<<"$rpath"; then
    fail "the installed extension has an RPATH into the build folder"
  fi
  cat >"$tmp/py_check.py" <<'EOF'
import os, sys
import stoker
prefix, work = sys.argv[1], sys.argv[2]
assert stoker.__file__.startswith(prefix), stoker.__file__
for c in range(2):
    os.makedirs(f"{work}/images/c{c}", exist_ok=True)
    for i in range(6):
        with open(f"{work}/images/c{c}/{i}.bin", "wb") as f:
            f.write(bytes([c]) * (500 + i))
info = stoker.pack(f"{work}/images", f"{work}/ds")
assert info["samples"] == 12, info
n = sum(len(b["label"]) for b in stoker.Loader(f"{work}/ds", batch_size=5, rank=0, world_size=1))
assert n == 12, n
print("python: stoker", stoker.__version__, "from", os.path.dirname(stoker.__file__), "packed and loaded", n)
EOF
  # unshare -m: a private mount namespace, where an empty tmpfs hides the
  # build folder from this process only.
  env -i PATH=/usr/bin:/bin PYTHONPATH="$pydir" unshare -m sh -c \
    'mount -t tmpfs none "$1" && cd / && /usr/bin/python3 "$2" "$3" "$4"' sh \
    "$build" "$tmp/py_check.py" "$pydir" "$tmp/py-work" || fail "the installed Python package does not work without the build folder"
fi

# ---- 5. --version and completion ------------------------------------------------
step "stoker --version, bash completion"
version=$("$prefix/bin/stoker" --version)
echo "$version"
grep -q '^stoker [0-9]' <<<"$version" || fail "--version has no version"
grep -q '^built with: ' <<<"$version" || fail "--version has no build options"
grep -q '^git revision: ' <<<"$version" || fail "--version has no git revision"
complete_words() { # complete_words WORDS... -> the completions of the last word
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _stoker; echo "${COMPREPLY[*]}"' \
    sh "$prefix/share/bash-completion/completions/stoker" "$@"
}
[[ "$(complete_words stoker be)" == "bench" ]] || fail "completion of 'stoker be' is '$(complete_words stoker be)'"
[[ " $(complete_words stoker bench '') " == *" storage "* ]] || fail "completion of 'stoker bench ' lacks storage"
[[ " $(complete_words stoker pack --sh) " == *" --shard-mib "* ]] || fail "completion of 'stoker pack --sh' lacks --shard-mib"

# ---- 6. Debian packages in a fresh Debian 12 ------------------------------------
if [[ "${STOKER_INSTALL_TEST_DEB:-1}" == 0 ]]; then
  echo "install_test: Debian package part skipped (STOKER_INSTALL_TEST_DEB=0)"
  echo "install_test: OK"
  exit 0
fi
step "Debian packages: scripts/package.sh (this version and an older one)"
"$src/scripts/package.sh" "$build" --out "$tmp/debs" >/dev/null
"$src/scripts/package.sh" "$build" --out "$tmp/debs-old" --version 0.0.1 >/dev/null
version_now=$(dpkg-deb -f "$tmp"/debs/stoker_*.deb Version)

step "a fresh Debian 12 root (debootstrap --variant=minbase bookworm)"
# The mirror apt uses here (deb822 or one-line sources).
mirror=$({ cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null || true; } |
  grep -oE 'https?://[^ ]*/debian/?( |$)' | grep -v security | head -1 | tr -d ' ' || true)
mirror=${mirror:-http://deb.debian.org/debian}
cache=/var/cache/stoker-test
tarball=$cache/bookworm-minbase-root.tar.gz
chroot_dir=$tmp/root
mkdir -p "$cache" "$chroot_dir"
if [[ ! -s "$tarball" ]]; then
  echo "debootstrap from $mirror (once; cached in $tarball)"
  debootstrap --variant=minbase bookworm "$chroot_dir" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
    { tail -20 "$tmp/debootstrap.log"; fail "debootstrap"; }
  tar -C "$chroot_dir" -czf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
else
  tar -C "$chroot_dir" -xzf "$tarball"
fi
mount -t proc proc "$chroot_dir/proc"
# Downloaded packages kept between runs, as the root is.
mkdir -p "$cache/apt-archives/partial"
mount --bind "$cache/apt-archives" "$chroot_dir/var/cache/apt/archives"
cp -L /etc/resolv.conf "$chroot_dir/etc/resolv.conf"
in_root() { chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  DEBIAN_FRONTEND=noninteractive "$@"; }
mkdir -p "$chroot_dir/tmp/debs" "$chroot_dir/tmp/debs-old"
cp "$tmp"/debs/*.deb "$chroot_dir/tmp/debs/"
cp "$tmp"/debs-old/*.deb "$chroot_dir/tmp/debs-old/"
in_root apt-get update -qq >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt-get update in the Debian 12 root"; }

step "apt-get install the older packages, then these over them"
in_root sh -c 'cd /tmp/debs-old && apt-get install -y -qq ./stoker_*.deb ./libstoker_*.deb ./libstoker-dev_*.deb ./python3-stoker_*.deb' \
  >"$tmp/apt-old.log" 2>&1 || { tail -30 "$tmp/apt-old.log"; fail "apt-get install of the older packages"; }
in_root sh -c 'cd /tmp/debs && apt-get install -y -qq ./stoker_*.deb ./libstoker_*.deb ./libstoker-dev_*.deb ./python3-stoker_*.deb' \
  >"$tmp/apt-new.log" 2>&1 || { tail -30 "$tmp/apt-new.log"; fail "apt-get install of the packages over the older ones"; }
for p in stoker libstoker libstoker-dev python3-stoker; do
  v=$(in_root dpkg-query -W -f='${Version} ${Status}' "$p")
  [[ "$v" == "$version_now install ok installed" ]] || fail "$p is '$v' after the upgrade, not $version_now"
done
in_root dpkg --verify stoker libstoker libstoker-dev python3-stoker || fail "dpkg --verify: installed files differ from the packages"

step "pack and load a dataset in the Debian 12 root with the installed command and Python"
cat >"$chroot_dir/tmp/check.sh" <<'EOF'
set -eu
stoker --version
for c in a b; do
  mkdir -p /tmp/images/$c
  for i in 1 2 3 4 5; do head -c $((700 + i)) /dev/urandom >/tmp/images/$c/$i.bin; done
done
stoker pack /tmp/images /tmp/ds
stoker verify /tmp/ds
stoker inspect /tmp/ds | grep -q 'samples *10'
cd /
python3 -c '
import stoker
n = sum(len(b["label"]) for b in stoker.Loader("/tmp/ds", batch_size=4, rank=0, world_size=1))
assert n == 10, n
print("python3 in the Debian 12 root: stoker", stoker.__version__, "loaded", n, "samples")
'
test -f /usr/share/bash-completion/completions/stoker
test -f /usr/lib/pkgconfig/stoker.pc -o -f /usr/lib/x86_64-linux-gnu/pkgconfig/stoker.pc
EOF
in_root sh /tmp/check.sh || fail "the installed packages do not pack and load in the Debian 12 root"
echo "install_test: OK"
