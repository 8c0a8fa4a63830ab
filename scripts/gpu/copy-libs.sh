#!/usr/bin/env bash
# Copies the shared libraries that BINARY... need, other than glibc's, the
# C++ runtime's and the loader, into DEST: what a carry folder needs on the
# GPU machine, whose image is another distribution and lacks the Debian
# packages these come from.
#
#   scripts/gpu/copy-libs.sh DEST BINARY...
set -euo pipefail
dest=$1
shift
mkdir -p "$dest"
ldd "$@" | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux|libdl|librt|libpthread)\.so' |
  while read -r lib; do cp -L "$lib" "$dest/"; done
