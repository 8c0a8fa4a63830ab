#!/usr/bin/env bash
# `stoker exporter`'s GPU series (NVML, loaded at run time) on a GPU machine.
#
#   scripts/gpu-check.sh prepare            here (builds .gpu-carry/ with stoker)
#   bash scripts/gpu/metrics.sh             there, from the repository root
#   (device tool: run(command="bash scripts/gpu/metrics.sh", carry=[".gpu-carry"]))
#
# Starts the exporter on a loopback port, loads the GPUs for a few seconds
# with torch (when present), scrapes, and checks that every GPU series
# exists for every GPU; prints the scrape's latency and series count, the
# exporter's warnings (XID events unsupported, say) and the GPU lines; then,
# where the Python binding is built, bench/metrics_bench.py (loader with
# metrics on vs off, a scrape of 8 processes). Exit 0 when every required
# GPU series is there. Output also in $OUT (if set).
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${STOKER:-.gpu-carry/bin/stoker}
[[ -x $bin ]] || bin=build/stoker
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
work=$(mktemp -d)
port=${STOKER_EXPORTER_PORT:-19478}
# STOKER_NVML: another NVML (e.g. build/tests/libfake_nvml.so, to try this
# script where there is no GPU).
"$bin" exporter --listen "127.0.0.1:$port" --dir "$work/m" --watch /tmp \
  ${STOKER_NVML:+--nvml "$STOKER_NVML"} >"$work/exporter.log" 2>&1 &
exporter=$!
trap 'kill $exporter 2>/dev/null; wait $exporter 2>/dev/null' EXIT
sleep 1
if command -v python3 >/dev/null && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  python3 - <<'PY' &
import time, torch
n = torch.cuda.device_count()
xs = [torch.randn(8192, 8192, device=f"cuda:{i}") for i in range(n)]
host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
end = time.time() + 6
while time.time() < end:
    for i, x in enumerate(xs):
        (x @ x).sum()
        host.to(f"cuda:{i}", non_blocking=True)
torch.cuda.synchronize()
PY
  load=$!
  sleep 4
fi
python3 - "$port" "$work" <<'PY' | tee "$work/summary.txt"
import sys, time, urllib.request
port, work = sys.argv[1], sys.argv[2]
t = time.perf_counter()
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
ms = (time.perf_counter() - t) * 1000
lines = [l for l in text.splitlines() if l and not l.startswith("#")]
print(f"scrape: {ms:.1f} ms, {len(lines)} series")
gpus = sorted({l.split('gpu="')[1].split('"')[0] for l in lines if 'gpu="' in l}, key=int)
print(f"GPUs: {len(gpus)}")
required = ["stoker_gpu_utilization_ratio", "stoker_gpu_memory_used_bytes",
            "stoker_gpu_memory_total_bytes", "stoker_gpu_power_watts",
            "stoker_gpu_temperature_celsius", "stoker_gpu_sm_clock_hertz",
            "stoker_gpu_pcie_rx_bytes_per_second", "stoker_gpu_pcie_tx_bytes_per_second",
            "stoker_gpu_clocks_throttled"]
optional = ["stoker_gpu_ecc_errors_total", "stoker_gpu_xid_errors_total"]
missing = []
for name in required:
    for g in gpus:
        if not any(l.startswith(name + "{") and f'gpu="{g}"' in l for l in lines):
            missing.append(f"{name} gpu {g}")
for name in optional:
    print(f"{name}: {'present' if any(l.startswith(name) for l in lines) else 'absent'}")
for l in lines:
    if l.startswith("stoker_gpu_") and 'gpu="0"' in l:
        print("  " + l)
print("missing: " + (", ".join(missing) if missing else "none"))
sys.exit(1 if missing or not gpus else 0)
PY
rc=${PIPESTATUS[0]}
echo "exporter's messages:"; cat "$work/exporter.log"
# XID events cannot be made on demand: say at least whether NVML let the
# exporter watch for them (the series appear with the first XID).
if grep -q "no XID events" "$work/exporter.log"; then
  echo "XID watch: not supported here (registration refused): XID series absent, as designed"
else
  echo "XID watch: registered (no XID seen unless listed above)"
fi | tee -a "$work/summary.txt"
kill $exporter 2>/dev/null
# The metrics' overhead on the loader, on this quieter and larger machine,
# when the Python binding is there (scripts/gpu-check.sh run builds it in
# /tmp/stoker-py).
# STOKER_METRICS_SAMPLES sets the epoch's length (default 40,000 samples of
# 16 KiB: about 60 ms an epoch there, short enough for scheduling noise to
# show; 200,000 gives 0.3 s).
if [[ -f /tmp/stoker-py/stoker/__init__.py ]]; then
  PYTHONPATH=/tmp/stoker-py timeout 900 python3 bench/metrics_bench.py --stoker "$bin" \
    --samples "${STOKER_METRICS_SAMPLES:-40000}" --rounds 9 --json "$work/metrics_bench.json" |
    tee -a "$work/summary.txt"
else
  echo "metrics bench: no /tmp/stoker-py (run scripts/gpu-check.sh run first)" | tee -a "$work/summary.txt"
fi
[[ -n ${OUT:-} ]] && cp "$work"/summary.txt "$work"/exporter.log "$work"/*.json "$OUT/" 2>/dev/null
exit "$rc"
