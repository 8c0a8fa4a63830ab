#!/usr/bin/env bash
# The README's first command: install what the core needs, build, run the
# demo on the embedded default store (a local folder). Debian 12, as root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTOKER_BUILD_TESTS=OFF
cmake --build build -j"$(nproc)" --target stoker
build/stoker demo --json stoker-demo.json "$@"
