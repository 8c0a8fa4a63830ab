#!/usr/bin/env bash
# One device call for everything a wave needs a GPU for, each step under a
# time limit of its own so that a slow step cannot take the others' time:
# GPU tests and compute-sanitizer, the Python GPU tests, NCCL collectives on
# the one GPU (scripts/gpu/comm.sh), doctor (read-only), the exporter's NVML
# series (scripts/gpu/metrics.sh), the demo (scripts/gpu/demo.sh), the GPU
# decode's tests and benchmark (scripts/gpu/decode.sh, issue 34), the GPU
# checkpoints' (scripts/gpu/ckpt_gpu.sh, issue 33) and the WebDataset
# import rate against cat / tar -xf on this machine's disk
# (bench/import_rate.py, issue 32). All of them run the stoker of
# .gpu-carry (scripts/gpu-check.sh prepare here).
#
#   run(command="bash scripts/gpu/wave.sh", carry=[".gpu-carry"])
#
# STOKER_WAVE_STEPS (default "check,decode,ckpt,import") picks steps; the
# others: comm, doctor, metrics, demo. What the steps write goes to
# /tmp/wave/STEP/ and comes back packed in $OUT/wave.tar.gz (the device tool
# brings back at most 8 files), with the printed summary in
# $OUT/wave-summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
dest=${OUT:-$PWD/gpu-out}
mkdir -p "$dest"
out=/tmp/wave
rm -rf "$out"
mkdir -p "$out"
exec > >(tee "$dest/wave-summary.txt") 2>&1
trap 'tar czf "$dest/wave.tar.gz" -C /tmp wave 2>/dev/null' EXIT
steps=${STOKER_WAVE_STEPS:-check,decode,ckpt,import}
bash scripts/gpu-check.sh unpack  # what prepare compressed to fit the carry
want() { [[ ",$steps," == *",$1,"* ]]; }
# The other scripts look for their own carry folder: the same binaries.
for d in build-gpu-comm/carry .demo-carry; do
  mkdir -p "$(dirname "$d")" && rm -rf "$d" && cp -r .gpu-carry "$d"
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
stage() { echo; echo "######## $1 (at $(($(date +%s) - t0)) s) ########"; }
if want check; then
  stage "GPU tests, compute-sanitizer, Python GPU tests"
  STOKER_GPU_STEPS=tests,sanitizer,python OUT=$out/check timeout 200 bash scripts/gpu-check.sh run 2>&1 |
    grep -E '^(====|\[ +(OK|FAILED|SKIPPED) |compute-sanitizer|[0-9]+ passed|FAILED|gpu-check:|python)' | tail -40
fi
if want comm; then
  stage "NCCL collectives on one GPU"
  # Every step issue 18 needs (comm.sh: bench to 1 GiB in every dtype, the
  # corruption hook, the ratio to torch's NCCL, tune, compute-sanitizer),
  # each cut to what is left of the budget: 200 s beside the other steps,
  # 540 s with STOKER_WAVE_STEPS=comm alone. comm.sh ends with a summary.
  comm_budget=${STOKER_WAVE_COMM_BUDGET:-$([[ $steps == comm ]] && echo 540 || echo 200)}
  STOKER_COMM_BUDGET=$comm_budget OUT=$out/comm timeout $((comm_budget + 30)) \
    bash scripts/gpu/comm.sh run 2>&1 | tail -60
fi
if want doctor; then
  stage "doctor (read-only)"
  OUT=$out/doctor timeout 90 bash scripts/gpu/doctor.sh run 2>&1 | tail -45
fi
if want metrics; then
  stage "exporter: NVML series"
  OUT=$out/metrics timeout 60 bash scripts/gpu/metrics.sh 2>&1 | tail -25
fi
if want demo; then
  stage "demo"
  OUT=$out/demo timeout 150 bash scripts/gpu/demo.sh run 2>&1 | tail -30
fi
if want decode; then
  stage "GPU decode: tests, sanitizer, bench (issue 34)"
  OUT=$out/decode timeout 400 bash scripts/gpu/decode.sh run 2>&1 | tail -60
fi
if want ckpt; then
  stage "GPU checkpoints: tests, bench (issue 33)"
  OUT=$out/ckpt timeout 420 bash scripts/gpu/ckpt_gpu.sh run 2>&1 | tail -60
fi
if want import; then
  stage "WebDataset import vs cat / tar -xf on this disk (issue 32)"
  df -h /var/tmp | tail -1
  mkdir -p "$out/import"
  LD_LIBRARY_PATH=$PWD/.gpu-carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1 \
    timeout 300 python3 bench/import_rate.py --stoker .gpu-carry/bin/stoker --dir /var/tmp \
    --tars "${STOKER_WAVE_IMPORT_TARS:-8}" --repeat 3 --json 2>&1 | tee "$out/import/import_rate.json"
fi
stage done
