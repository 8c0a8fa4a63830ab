#!/usr/bin/env bash
# The one entry for GPU measurements and GPU tests: each step named on the
# command line runs on this (GPU) machine under a time limit of its own, so
# that a slow step cannot take the others' time, from the one carry folder
# .gpu-carry (made on the build machine by `bash scripts/gpu-check.sh
# prepare`; docs/benchmarks.md, "How GPU measurements are run"):
#
#   run(command="bash scripts/gpu/run.sh check decode", carry=[".gpu-carry"])
#
# Steps (default: check decode ckpt import). STEP:SUB,SUB runs only those
# parts of a step, e.g. check:tests,python or loader:gpu,dma.
#   check    GPU tests, compute-sanitizer, Python GPU tests (scripts/gpu-check.sh run;
#            parts tests,sanitizer,loader_test,h2d,python,loader,ckpt; default the first,
#            second and fifth)
#   comm     NCCL collectives on the GPUs here (scripts/gpu/comm.sh; parts
#            bench,corrupt,torch,tune,sanitizer)
#   doctor   stoker doctor, read-only (scripts/gpu/doctor.sh)
#   metrics  the exporter's NVML series (scripts/gpu/metrics.sh)
#   demo     stoker demo (scripts/gpu/demo.sh)
#   decode   the GPU decode's tests and benchmark (scripts/gpu/decode.sh; parts
#            tests,sanitizer,bench; issue 34)
#   ckpt     GPU checkpoints' tests and benchmark (scripts/gpu/ckpt_gpu.sh; issue 33)
#   import   WebDataset import against cat / tar -xf on this disk (bench/import_rate.py;
#            issue 32)
#   loader   the loader's GPU benchmarks (scripts/gpu/loader.sh; parts
#            scaling,bench,gpu,dma and the others it lists)
#   cache    the node cache on this machine (scripts/gpu/cache.sh)
#   multi    several GPUs of one host (scripts/multi-gpu-check.sh; parts
#            comm,tune,topo,loader,ckpt)
#
# What the steps write goes to /tmp/wave/STEP/ and comes back packed in
# $OUT/wave.tar.gz (the device tool brings back at most 8 files), with the
# printed summary in $OUT/wave-summary.txt. Knobs that are not steps:
# STOKER_WAVE_COMM_BUDGET (comm's seconds: 200 beside other steps, 540
# alone), STOKER_WAVE_IMPORT_TARS (import's tars, default 8), and each
# script's own (data sizes, repeats), listed in its header.
set -uo pipefail
cd "$(dirname "$0")/../.."

known="check comm doctor metrics demo decode ckpt import loader cache multi"
usage() {
  echo "usage: $0 [STEP[:PART,...]]...   steps: $known (default: check decode ckpt import)" >&2
  exit 2
}
[[ $# -gt 0 ]] || set -- check decode ckpt import
declare -A parts=()
order=()
for arg in "$@"; do
  name=${arg%%:*}
  [[ " $known " == *" $name "* ]] || { echo "$0: unknown step '$name'" >&2; usage; }
  order+=("$name")
  [[ $arg == *:* ]] && parts[$name]=${arg#*:}
done
# VAR=PARTS where STEP:PARTS was named, for the step's script (which reads
# VAR; without it, the script's own default).
parts_env() { [[ -z ${parts[$2]:-} ]] || echo "$1=${parts[$2]}"; }

dest=${OUT:-$PWD/gpu-out}
mkdir -p "$dest"
out=/tmp/wave
rm -rf "$out"
mkdir -p "$out"
exec > >(tee "$dest/wave-summary.txt") 2>&1
trap 'tar czf "$dest/wave.tar.gz" -C /tmp wave 2>/dev/null' EXIT
bash scripts/gpu-check.sh unpack  # what prepare compressed to fit the carry
# comm.sh, demo.sh and multi-gpu-check.sh look for carry folders of their
# own: the same binaries.
for d in build-gpu-comm/carry .demo-carry; do
  mkdir -p "$(dirname "$d")" && rm -rf "$d" && cp -r .gpu-carry "$d"
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
stage() { echo; echo "######## $1 (at $(($(date +%s) - t0)) s) ########"; }

# step STEP "TITLE" PARTS_VAR SECONDS LINES COMMAND...: COMMAND with
# OUT=/tmp/wave/STEP (and PARTS_VAR=PARTS where STEP:PARTS was named) under
# a time limit of SECONDS, the last LINES of what it prints shown.
step() {
  local name=$1 title=$2 var=$3 limit=$4 lines=$5
  shift 5
  stage "$title"
  env ${var:+$(parts_env "$var" "$name")} OUT="$out/$name" timeout "$limit" "$@" 2>&1 |
    tail -"$lines"
}

for name in "${order[@]}"; do
  case $name in
    check)
      stage "GPU tests, compute-sanitizer, Python GPU tests"
      STOKER_GPU_STEPS=${parts[check]:-tests,sanitizer,python} OUT=$out/check timeout 200 \
        bash scripts/gpu-check.sh run 2>&1 |
        grep -E '^(====|\[ +(OK|FAILED|SKIPPED) |compute-sanitizer|[0-9]+ passed|FAILED|gpu-check:|python)' |
        tail -40
      ;;
    comm)
      # Every step issue 18 needs (comm.sh: bench to 1 GiB in every dtype, the
      # corruption hook, the ratio to torch's NCCL, tune, compute-sanitizer),
      # each cut to what is left of the budget. comm.sh ends with a summary.
      budget=${STOKER_WAVE_COMM_BUDGET:-$([[ ${#order[@]} -eq 1 ]] && echo 540 || echo 200)}
      step comm "NCCL collectives on one GPU" STOKER_COMM_STEPS $((budget + 30)) 60 \
        env STOKER_COMM_BUDGET="$budget" bash scripts/gpu/comm.sh run
      ;;
    doctor) step doctor "doctor (read-only)" "" 90 45 bash scripts/gpu/doctor.sh run ;;
    metrics) step metrics "exporter: NVML series" "" 60 25 bash scripts/gpu/metrics.sh ;;
    demo) step demo "demo" "" 150 30 bash scripts/gpu/demo.sh run ;;
    decode)
      step decode "GPU decode: tests, sanitizer, bench (issue 34)" STOKER_DECODE_STEPS 400 60 \
        bash scripts/gpu/decode.sh run
      ;;
    ckpt)
      step ckpt "GPU checkpoints: tests, bench (issue 33)" "" 420 60 bash scripts/gpu/ckpt_gpu.sh run
      ;;
    import)
      stage "WebDataset import vs cat / tar -xf on this disk (issue 32)"
      df -h /var/tmp | tail -1
      mkdir -p "$out/import"
      LD_LIBRARY_PATH=$PWD/.gpu-carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1 \
        timeout 300 python3 bench/import_rate.py --stoker .gpu-carry/bin/stoker --dir /var/tmp \
        --tars "${STOKER_WAVE_IMPORT_TARS:-8}" --repeat 3 --json 2>&1 |
        tee "$out/import/import_rate.json"
      ;;
    loader)
      step loader "loader on the GPU" STOKER_LOADER_STEPS 540 60 bash scripts/gpu/loader.sh run
      ;;
    cache) step cache "node cache" "" 540 60 bash scripts/gpu/cache.sh run ;;
    multi)
      step multi "several GPUs of one host (issue 22)" STOKER_MGPU_STEPS 570 80 \
        bash scripts/multi-gpu-check.sh run
      ;;
  esac
done
stage done
