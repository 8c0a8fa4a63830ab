#!/usr/bin/env bash
# Makes stoker's Debian packages with CPack: stoker (the command),
# libstoker, libstoker-dev and python3-stoker, for Debian 12.
#
#   scripts/package.sh                 configure and build build-pkg/ (Release,
#                                      prefix /usr, every optional part this
#                                      machine has), then package it
#   scripts/package.sh BUILD_DIR       package an existing build as it is
#                                      (e.g. CI's build/, by the install test)
#   --out DIR       where the .deb files go (default BUILD_DIR/packages)
#   --version V     package version (default the project's; the install test
#                   makes an older one to install over)
#
# Install them with: apt-get install ./stoker_*.deb ./libstoker*.deb ./python3-stoker_*.deb
# Prints the paths of the packages made.
set -euo pipefail
cd "$(dirname "$0")/.."

build=""
out=""
version=""
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "package.sh: unknown option $1" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done

if [[ -z "$build" ]]; then
  build=build-pkg
  cuda=OFF
  [[ -x /usr/local/cuda/bin/nvcc ]] && cuda=ON
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
    -DSTOKER_BUILD_TESTS=OFF -DSTOKER_WITH_RADOS=ON -DSTOKER_WITH_PYTHON=ON -DSTOKER_WITH_MPI=ON \
    -DSTOKER_WITH_CUDA="$cuda" "${launcher[@]}" >/dev/null
  cmake --build "$build" -j"$(nproc)"
elif [[ ! -f "$build/CPackConfig.cmake" ]]; then
  echo "package.sh: $build is not a configured stoker build (no CPackConfig.cmake)" >&2
  exit 2
else
  # Whatever the install needs that is not built yet.
  cmake --build "$build" -j"$(nproc)" --target stoker stoker_shared stoker_static stoker_completion \
    $(grep -q '^STOKER_WITH_PYTHON:BOOL=ON' "$build/CMakeCache.txt" && echo stoker_python)
fi

build=$(cd "$build" && pwd)
out=${out:-$build/packages}
mkdir -p "$out"
out=$(cd "$out" && pwd)
args=(-G DEB -B "$out" --config "$build/CPackConfig.cmake")
[[ -n "$version" ]] && args+=(-D "CPACK_PACKAGE_VERSION=$version")
log=$out/cpack.log
if ! (cd "$build" && cpack "${args[@]}") >"$log" 2>&1; then
  cat "$log" >&2
  echo "package.sh: cpack failed (log: $log)" >&2
  exit 1
fi
ls "$out"/*.deb
