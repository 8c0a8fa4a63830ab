"""stoker.metrics: the step breakdown of a real training loop, its run log, and
the HTML report in headless Chromium."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import stoker
from conftest import SOURCE_DIR

STOKER = os.environ.get("STOKER_BIN") or shutil.which("stoker")
CHROMIUM = shutil.which("chromium")
FASHION = Path("/usr/share/datasets/fashion-mnist")


def test_phases_sum_to_the_step_and_an_unknown_phase_is_an_error(tmp_path):
    log = tmp_path / "run.jsonl"
    stoker.metrics.start(log)
    for _ in range(3):
        with stoker.phase("compute"):
            time.sleep(0.01)
        with stoker.phase("checkpoint"):
            time.sleep(0.005)
        time.sleep(0.002)  # other
        r = stoker.metrics.step()
        assert r["compute"] >= 0.01 and r["checkpoint"] >= 0.005 and r["other"] >= 0.002
        parts = sum(r[p] for p in stoker.metrics.PHASES) + r["other"]
        assert abs(parts - r["seconds"]) < 1e-6
    stoker.metrics.stop()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    with pytest.raises(ValueError, match="unknown phase 'gpu'"):
        with stoker.phase("gpu"):
            pass
    assert "compute" in stoker.metrics.table()


def test_exposition_passes_promtool():
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian: prometheus) is not installed")
    r = subprocess.run(["promtool", "check", "metrics"], input=stoker.metrics.exposition(),
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def exposed(series):
    """The value of `series` (name and labels, as exposed) in this process, 0 if absent."""
    for line in stoker.metrics.exposition().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


CKPT_SERIES = ["stoker_checkpoint_saves_total", "stoker_checkpoint_completed_total",
               "stoker_checkpoint_failures_total", "stoker_checkpoint_written_bytes_total",
               "stoker_checkpoint_stall_seconds_count", "stoker_checkpoint_save_seconds_count"]


def test_a_save_is_counted_once_with_the_bytes_its_checkpoint_holds(tmp_path):
    """The C++ checkpointer counts the saves (stoker.save no longer does too)."""
    np = pytest.importorskip("numpy")
    before = {s: exposed(s) for s in CKPT_SERIES}
    root = str(tmp_path / "ckpt")
    stoker.save({"w": np.ones(1000, dtype=np.float32)}, root, step=1)
    stoker.save({"w": np.ones(2000, dtype=np.float32)}, root, step=2, async_=True).wait()
    with pytest.raises(stoker.AlreadyExistsError):
        stoker.save({"w": np.ones(10, dtype=np.float32)}, root, step=1)
    c = stoker.Checkpointer(root)
    written = sum(c.info(n)["bytes"] for n in ("step-000000000001", "step-000000000002"))
    delta = {s.removeprefix("stoker_checkpoint_"): exposed(s) - before[s] for s in CKPT_SERIES}
    assert delta == {"saves_total": 3, "completed_total": 2, "failures_total": 1,
                     "written_bytes_total": written, "stall_seconds_count": 3,
                     "save_seconds_count": 2}
    assert written > 12000  # the tensors and each rank's structure document


def test_the_stall_counts_from_when_the_skin_began_the_save(tmp_path):
    """_CheckpointSaveStarted, which stoker.save wraps its C++ call in, so that its
    flattening and GPU-to-host copies are in the stall (through the binding
    itself here, as stoker.save's own start cannot be set)."""
    np = pytest.importorskip("numpy")
    from stoker import _stoker

    impl = stoker.Checkpointer(str(tmp_path / "ckpt"))._c()
    w = np.ones(10, dtype=np.float32)
    tensors = [("w", "float32", [10], w.ctypes.data, w.nbytes)]
    before = exposed("stoker_checkpoint_stall_seconds_sum")
    # As if the skin had spent 50 ms flattening the state and copying it from a GPU.
    with _stoker._CheckpointSaveStarted(time.monotonic_ns() - 50_000_000):
        impl.save("a", tensors, _stoker._SaveOptions())
    assert exposed("stoker_checkpoint_stall_seconds_sum") - before >= 0.05
    # The scope has ended: the next stall is no longer than the call itself.
    before = exposed("stoker_checkpoint_stall_seconds_sum")
    began = time.monotonic()
    impl.save("b", tensors, _stoker._SaveOptions())
    took = time.monotonic() - began
    assert exposed("stoker_checkpoint_stall_seconds_sum") - before <= took


@pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_breakdown_sums_to_the_measured_step_time(tmp_path):
    log = tmp_path / "run.jsonl"
    cmd = [sys.executable, str(SOURCE_DIR / "examples" / "train_fashion_mnist.py"),
           "--work-dir", str(tmp_path / "work"), "--limit", "2000", "--batch-size", "64",
           "--threads", "2", "--steps", "60", "--log-every", "1000", "--save-every", "20",
           "--checkpoint", str(tmp_path / "ckpt"), "--run-log", str(log)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for name in ("data", "h2d", "compute", "comm", "checkpoint"):
        assert f"\n{name} " in out, out
    line = next(x for x in out.splitlines() if x.startswith("breakdown:"))
    share = float(line.split("(")[1].split("%")[0])
    assert 95.0 <= share <= 100.5, line
    steps = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(steps) == 60
    assert sum(s["checkpoint"] for s in steps) > 0  # the saves' stalls
    assert sum(s["data"] for s in steps) > 0
    # 2000 images in batches of 64: every step 64 samples but the epoch's last (16).
    assert sorted(s["samples"] for s in steps)[1:] == [64] * 59


def chromium(*args):
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
@pytest.mark.skipif(not STOKER, reason="STOKER_BIN is not set (run through ctest)")
def test_report_renders_in_chromium_with_every_plot_and_no_console_error(tmp_path):
    log = tmp_path / "run.jsonl"
    with open(log, "w") as f:
        for i in range(1, 301):
            data = 0.02 + 0.01 * (i % 7 == 0)
            f.write(json.dumps({
                "step": i, "seconds": 0.1 + data, "data": data, "h2d": 0.004, "compute": 0.06,
                "comm": 0.02, "checkpoint": 0.03 if i % 50 == 0 else 0.0, "other": 0.016,
                "samples": 256, "gpu_utilization": 0.9 - data * 5}) + "\n")
    html = tmp_path / "report.html"
    r = subprocess.run([STOKER, "report", str(log), "-o", str(html)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    shot = tmp_path / "report.png"
    r = chromium("--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
                 "--window-size=1000,1400", "--virtual-time-budget=2000", html.as_uri())
    assert shot.exists() and shot.stat().st_size > 20000, r.stderr
    console = [x for x in r.stderr.splitlines() if "CONSOLE" in x or "Uncaught" in x]
    assert not console, console
    r = chromium("--dump-dom", "--virtual-time-budget=2000", html.as_uri())
    dom = r.stdout
    for plot in ("plot-breakdown", "plot-throughput", "plot-data-wait", "plot-gpu",
                 "plot-checkpoint"):
        assert f'id="{plot}"' in dom, plot
    assert dom.count('class="series"') >= 10
    assert '<table id="summary">' in dom
    if os.environ.get("STOKER_REPORT_SCREENSHOT"):  # to look at it
        shutil.copy(shot, os.environ["STOKER_REPORT_SCREENSHOT"])

    # A bad line: an error naming the file and line.
    with open(log, "a") as f:
        f.write("not json\n")
    r = subprocess.run([STOKER, "report", str(log)], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode != 0 and f"{log}:301" in r.stderr, r.stderr


DDP_CHILD = r"""
import os, sys, json
import torch, torch.distributed as dist, torch.nn as nn
import stoker

def run(rank, world, init):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    plain = nn.Linear(64, 64)
    timed = nn.Linear(64, 64)
    timed.load_state_dict(plain.state_dict())
    plain = nn.parallel.DistributedDataParallel(plain)
    timed = nn.parallel.DistributedDataParallel(timed)
    timed.register_comm_hook(None, stoker.timed_allreduce_hook)
    x = torch.randn(32, 64) * (rank + 1)  # the ranks' gradients differ
    stoker.metrics.start()
    comm = 0.0
    for _ in range(3):
        with stoker.phase("compute"):
            timed(x).pow(2).sum().backward()
        comm += stoker.metrics.step()["comm"]
    for _ in range(3):
        plain(x).pow(2).sum().backward()
    same = all(torch.allclose(a.grad, b.grad) for a, b in zip(plain.parameters(), timed.parameters()))
    line = json.dumps({"rank": rank, "comm": comm, "same": same}) + "\n"
    os.write(1, line.encode())  # one write: the two ranks' lines do not mix
    dist.destroy_process_group()

if __name__ == "__main__":
    import torch.multiprocessing as mp
    mp.spawn(run, args=(2, "file://" + sys.argv[1]), nprocs=2)
"""


def test_timed_allreduce_hook_averages_like_ddp_and_times_comm(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_CHILD)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "rendezvous")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    results = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(results) == 2, r.stdout
    for res in results:
        assert res["same"], res  # the same gradients as DDP's own all-reduce
        assert res["comm"] > 0, res
