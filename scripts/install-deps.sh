#!/usr/bin/env bash
# Installs what stoker needs on Debian 12, as root. Idempotent.
#   scripts/install-deps.sh          build + demo (the core)
#   scripts/install-deps.sh --all    also everything the full test suite,
#                                    the Ceph cluster and the benchmarks use
set -euo pipefail

core=(build-essential cmake pkg-config git
  libxxhash-dev nlohmann-json3-dev libcli11-dev liburing-dev libturbojpeg0-dev libjpeg-dev
  libarchive-dev)
full=(libgtest-dev libgmock-dev clang libclang-rt-14-dev fio python3
  ceph-mon ceph-osd ceph-common librados-dev ceph-mds ceph-fuse
  pybind11-dev libdlpack-dev python3-numpy python3-pytest python3-torch python3-torchvision
  libopenmpi-dev openmpi-bin
  libhwloc-dev hwloc
  dataset-fashion-mnist procps e2fsprogs mount)
# The install test (tests/install): a fresh Debian 12 root for the .deb files.
full+=(debootstrap)
# Metrics: prometheus-cpp renders the text format (core); the tests run a real
# Prometheus and render the report in headless Chromium.
core+=(prometheus-cpp-dev)
full+=(prometheus chromium)

pkgs=("${core[@]}")
if [[ "${1:-}" == "--all" ]]; then pkgs+=("${full[@]}"); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi
