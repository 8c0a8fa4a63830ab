#!/usr/bin/env bash
# The former GPU entry, kept for the calls that still name it:
#   STOKER_WAVE_STEPS=decode,import bash scripts/gpu/wave.sh
# is scripts/gpu/run.sh with those steps, in this order (default "check,
# decode,ckpt,import"; names it does not know are ignored, as they were).
# New calls use run.sh (docs/benchmarks.md, "How GPU measurements are run").
set -uo pipefail
steps=()
for step in check comm doctor metrics demo decode ckpt import; do
  [[ ",${STOKER_WAVE_STEPS:-check,decode,ckpt,import}," == *",$step,"* ]] && steps+=("$step")
done
[[ ${#steps[@]} -gt 0 ]] || exit 0
exec bash "$(dirname "$0")/run.sh" "${steps[@]}"
