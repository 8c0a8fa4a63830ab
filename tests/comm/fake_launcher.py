"""A stand-in for a launcher in `stoker tune comm`'s tests: prints what
`stoker bench comm --json` prints, with a bus bandwidth chosen by the
setting in the environment (FAKE_BUSBW: "ALGO/PROTO=GB/s,..." and
"default=GB/s"), and fails for settings listed in FAKE_FAIL, as a machine
without NVLS does. The noise (FAKE_NOISE, a fraction) is not random: a
setting's runs go -noise, +noise, 0, -noise, ... (counted in files under
FAKE_STATE), so a test's outcome does not depend on a draw."""
import json
import os
import sys

args = sys.argv[1:]
setting = f"{os.environ.get('NCCL_ALGO', '')}/{os.environ.get('NCCL_PROTO', '')}"
if setting == "/":
    setting = "default"
if setting in os.environ.get("FAKE_FAIL", "").split(","):
    print(f"NCCL WARN no algorithm for {setting}", file=sys.stderr)
    sys.exit(1)
table = dict(kv.split("=") for kv in os.environ["FAKE_BUSBW"].split(","))
busbw = float(table.get(setting, table["default"]))
size = int(args[args.index("--min-bytes") + 1])
noise = float(os.environ.get("FAKE_NOISE", "0.01"))
count_file = os.path.join(os.environ["FAKE_STATE"], setting.replace("/", "_"))
run = int(open(count_file).read()) if os.path.exists(count_file) else 0
with open(count_file, "w") as f:
    f.write(str(run + 1))
print(json.dumps({"world_size": 8, "backend": "nccl", "results": [
    {"op": "allreduce", "dtype": "float32", "bytes": size,
     "busbw_gbps": busbw * (1 + noise * (-1, 1, 0)[run % 3])}]}))
