#!/usr/bin/env bash
# Where the GPU decode's copier thread spends its time (issue 34): samples
# the stacks of bench/gpu_decode_bench.py's stoker_gpu way with gdb while
# it runs, and counts, for the thread running DeviceStage::CopierLoop, the
# innermost frames (a poor man's profiler: no perf on the GPU image).
# Run on an H100 (2026-12-07 17:37 UTC) it measures itself, not the copier:
# 8 of 9 samples were in cuLaunchKernel under libcudadebugger.so's
# pthread_rwlock_wrlock. The driver maps libcudadebugger once a debugger
# attaches (the same bench without gdb has it unmapped, /proc/PID/maps),
# and every launch then takes its lock. Use the loader's counters instead
# (LoaderStats::copier_*, gpu_decode_*, printed by the bench).
# Sampling stops after STOKER_PROFILE_SECONDS (default 90), so that the
# count is printed within the caller's limit.
#
#   run(command="bash scripts/gpu/decode_profile.sh", carry=[".gpu-carry"])
#
# Environment: STOKER_PROFILE_SAMPLES (default 20), STOKER_PROFILE_WAY
# (default stoker_gpu), STOKER_DECODE_IMAGES (default 24000; the data in
# /tmp/stoker-gpu-decode is reused when decode.sh made it in the same call).
set -uo pipefail
cd "$(dirname "$0")/../.."
samples=${STOKER_PROFILE_SAMPLES:-20}
way=${STOKER_PROFILE_WAY:-stoker_gpu}
dest=${OUT:-/tmp/decode-profile}
mkdir -p "$dest" /tmp/decode-profile/stacks
bash scripts/gpu-check.sh unpack >/dev/null 2>&1
OUT=$dest bash scripts/gpu-check.sh binding || exit 1
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib
export STOKER_NVJPEG_PATH=${STOKER_NVJPEG_PATH:-/usr/local/cuda-13.0/targets/x86_64-linux/lib/libnvjpeg.so.13}
dbg=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
[[ -n $dbg ]] || { echo "decode_profile: no gdb or cuda-gdb here"; exit 2; }
PYTHONPATH=/tmp/stoker-py PYTHONUNBUFFERED=1 python3 bench/gpu_decode_bench.py \
  --dir /tmp/stoker-gpu-decode --images "${STOKER_DECODE_IMAGES:-24000}" --repeats 40 \
  --ways "$way" >"$dest/bench.log" 2>&1 &
pid=$!
# Until the loader runs: the GPU decode says which path it took when it
# opens (the bench's header line comes before the data is made).
for ((k = 0; k < 180; ++k)); do
  grep -q "decode device" "$dest/bench.log" 2>/dev/null && break
  sleep 1
done
sleep 3
stop_at=$(($(date +%s) + ${STOKER_PROFILE_SECONDS:-90}))
for ((i = 0; i < samples; ++i)); do
  kill -0 "$pid" 2>/dev/null || break
  (($(date +%s) < stop_at)) || break
  # Symbols of the binding alone: loading torch's made an attach take many
  # seconds (the first run, 12 samples, did not finish in 110 s).
  # nvJPEG's and the driver's exported names tell its host work from a
  # wait on the GPU.
  timeout 20 "$dbg" -p "$pid" -batch -ex 'set auto-solib-add off' -ex 'sharedlibrary _stoker' \
    -ex 'sharedlibrary nvjpeg' -ex 'sharedlibrary libcuda' -ex 'sharedlibrary libcudart' \
    -ex 'thread apply all bt 40' >/tmp/decode-profile/stacks/$i.txt 2>/dev/null
  sleep 0.2
done
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|MHz' | tee "$dest/lscpu.txt"
# Per sample: the copier's thread (its stack holds CopierLoop), its first
# named frames.
python3 - "$samples" <<'EOF' | tee "$dest/profile.txt"
import collections, glob, re, sys
inner, funcs, n = collections.Counter(), collections.Counter(), 0
for f in sorted(glob.glob("/tmp/decode-profile/stacks/*.txt")):
    threads = re.split(r"\nThread ", open(f, errors="replace").read())
    for t in threads:
        if "CopierLoop" not in t:
            continue
        n += 1
        # A frame without a name is named by its library: ??@libcuda.so.1.
        names = [f if f != "??" else "??@" + lib.rsplit("/", 1)[-1]
                 for f, lib in re.findall(r"^#\d+ +(?:0x[0-9a-f]+ in )?([^ (]+).*?(?: from (\S+))?$",
                                          t, re.M)]
        inner[" < ".join(names[:4])] += 1
        for name in set(names):
            if "stoker" in name or name.startswith(("nvjpeg", "cu", "cuda", "mem", "??@")):
                funcs[name] += 1
print(f"{n} samples of the copier thread")
print("innermost frames:")
for k, v in inner.most_common(15):
    print(f"  {v:3}  {k[:200]}")
print("functions on the stack (samples holding each):")
for k, v in funcs.most_common(25):
    print(f"  {v:3}  {k[:160]}")
EOF
