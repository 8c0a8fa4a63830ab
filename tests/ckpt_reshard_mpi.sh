#!/usr/bin/env bash
# Resharding at load on real ranks: a state saved by 4 ranks loads on 1, 2, 3
# and 8, element for element; one saved by 8 loads on 2 with each rank
# reading at most 1.05x the bytes it receives (tests/ckpt_reshard_mpi.cc).
#   ckpt_reshard_mpi.sh BINARY MPIEXEC
set -euo pipefail
bin=$1 mpiexec=$2
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
run() { "$mpiexec" --allow-run-as-root --oversubscribe -np "$1" "$bin" "${@:2}"; }
run 4 save "$root" four 512
for n in 1 2 3 8; do run "$n" load "$root" four 512; done
# model.w: 8192 x 1024 float32 = 32 MiB, 4 MiB a saving rank.
run 8 save "$root" eight 8192
run 2 load "$root" eight 8192 1.05
echo "ckpt_reshard_mpi: ok"
