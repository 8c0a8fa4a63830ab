"""Collectives: `stoker bench comm` against its peers, in one run, allreduce
float32 at the same sizes, interleaved repeats, medians.

  --backend mpi  (this VM: 4 ranks under mpirun) stoker's mpi backend vs
                 Open MPI's own MPI_Allreduce loop (bench/comm_mpi_peer.c,
                 built here with mpicc) vs torch.distributed gloo
                 (bench/comm_peer.py), all launched the same way.
                 --variant NAME:VAR=VALUE[,VAR=VALUE] adds a stoker run with
                 those variables (e.g. "MPI_Allreduce:STOKER_COMM_MPI_ALLREDUCE=mpi").
  --backend nccl (a GPU machine: N ranks under torchrun) stoker's nccl
                 backend vs torch.distributed nccl.

Prints a table (busbw medians, GB/s, and the ratios stoker / peer) and,
with --json FILE, every run. Timing as nccl-tests: the mean per iteration,
averaged over ranks; busbw = bytes / time x 2(n-1)/n.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout[p.stdout.index("{"):])


def ratio(a, b):
    return a / b if b else float("nan")


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    a.add_argument("--backend", default="mpi", choices=["mpi", "nccl"])
    a.add_argument("--stoker", default=os.environ.get("STOKER_BIN", "build/stoker"))
    a.add_argument("--np", type=int, default=4)
    a.add_argument("--min", type=int, default=1 << 20, help="smallest size, bytes")
    a.add_argument("--max", type=int, default=64 << 20, help="largest size, bytes")
    a.add_argument("--step", type=int, default=8, help="size factor")
    a.add_argument("--repeats", type=int, default=5)
    a.add_argument("--iters", type=int, default=20)
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--mpirun", default="mpirun --allow-run-as-root --oversubscribe")
    a.add_argument("--torchrun", default="torchrun --standalone")
    a.add_argument("--python", default=sys.executable)
    a.add_argument("--json", help="write every run here")
    a.add_argument("--variant", action="append", default=[],
                   help="NAME:VAR=VALUE[,VAR=VALUE]: another stoker run with these variables")
    o = a.parse_args()
    sizes = [o.min]
    while sizes[-1] * o.step <= o.max:
        sizes.append(sizes[-1] * o.step)
    sweep = ["--min-bytes", str(o.min), "--max-bytes", str(sizes[-1]), "--step", str(o.step)]
    size_list = ",".join(map(str, sizes))
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    common = ["--warmup", str(o.warmup), "--iters", str(o.iters)]
    tools = {}
    variants = {}  # tool name -> extra environment
    if o.backend == "mpi":
        peer = "/tmp/stoker_comm_mpi_peer"
        subprocess.run(["mpicc", "-O2", "-o", peer, os.path.join(HERE, "comm_mpi_peer.c")],
                       check=True)
        launch = shlex.split(o.mpirun) + ["-np", str(o.np)]
        tools["stoker"] = [launch + [o.stoker, "bench", "comm", "--backend", "mpi", "--ops",
                                     "allreduce", "--json"] + sweep + common]
        for v in o.variant:
            name, _, assignments = v.partition(":")
            extra = dict(kv.split("=", 1) for kv in assignments.split(",") if kv)
            tools["stoker " + name] = [launch + sum((["-x", k] for k in extra), []) +
                                       tools["stoker"][0][len(launch):]]
            variants["stoker " + name] = extra
        tools["MPI_Allreduce"] = [launch + [peer, size_list, str(o.warmup), str(o.iters)]]
        tools["torch gloo"] = [launch + [o.python, os.path.join(HERE, "comm_peer.py"),
                                         "--backend", "gloo", "--sizes", size_list] + common]
    else:
        launch = shlex.split(o.torchrun) + [f"--nproc_per_node={o.np}"]
        tools["stoker"] = [launch + ["--no_python", o.stoker, "bench", "comm", "--backend", "nccl",
                                     "--ops", "allreduce", "--json"] + sweep + common]
        tools["torch nccl"] = [launch + [os.path.join(HERE, "comm_peer.py"), "--backend", "nccl",
                                         "--sizes", size_list] + common]
        if o.np == 1:
            # One rank: NCCL's in-place all_reduce (torch's) may have nothing
            # to move, stoker's out-of-place one copies the buffer; this peer
            # copies first, so both move the same bytes.
            tools["torch nccl copy+all_reduce"] = [tools["torch nccl"][0] + ["--copy-in"]]
    # With one rank the bus bandwidth is 0 by definition (factor 2(n-1)/n):
    # compare the algorithm bandwidth then.
    metric = "busbw_gbps" if o.np > 1 else "algbw_gbps"
    runs = {name: {s: [] for s in sizes} for name in tools}
    meta = {}
    for rep in range(o.repeats):
        for name, cmds in tools.items():
            for cmd in cmds:
                j = run_json(cmd, {**env, **variants.get(name, {})})
                meta.setdefault(name, {k: v for k, v in j.items() if k != "results"})
                for r in j["results"]:
                    runs[name][r["bytes"]].append(r[metric])
        print(f"round {rep + 1}/{o.repeats} done", file=sys.stderr)
    names = list(tools)
    if o.variant:
        print("variants: " + "; ".join(f"{n}: {v}" for n, v in variants.items()))
    print(f"allreduce float32, {o.np} ranks, {metric[:5]} GB/s, median of {o.repeats} "
          f"(min-max), {o.iters} iterations each")
    header = f"{'size':>10}" + "".join(f" {n:>26}" for n in names) + "".join(
        f" {'stoker/' + n:>20}" for n in names[1:])
    print(header)
    table = []
    for s in sizes:
        med = {n: statistics.median(runs[n][s]) for n in names}
        row = f"{s >> 20:>7} MiB" if s >= 1 << 20 else f"{s:>8} B"
        for n in names:
            row += f" {med[n]:>10.3f} ({min(runs[n][s]):.3f}-{max(runs[n][s]):.3f})"
        for n in names[1:]:
            row += f" {ratio(med['stoker'], med[n]):>20.3f}"
        print(row)
        table.append({"bytes": s, "metric": metric, "median": med,
                      "ratio": {n: ratio(med["stoker"], med[n]) for n in names[1:]}})
    if o.json:
        with open(o.json, "w") as f:
            json.dump({"runs": {n: {str(s): v for s, v in r.items()} for n, r in runs.items()},
                       "table": table, "meta": meta, "np": o.np, "backend": o.backend,
                       "variants": variants}, f,
                      indent=1)


if __name__ == "__main__":
    main()
