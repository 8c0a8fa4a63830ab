"""stoker's metrics through a real Prometheus server (Debian's `prometheus`).

The test starts `stoker exporter` on a free loopback port (with a stand-in
NVML, tests/fake_nvml.c, where there is no GPU) and Prometheus scraping it
every second, runs a process that loads a dataset and saves checkpoints with
metrics on, then asks Prometheus's HTTP API for the series: the bytes and
samples delivered equal what the loader reported, the saves are counted,
every query of dashboards/stoker.json returns series, and the process's
series go when it exits. Beside it, a C++ program (tests/metrics_ckpt_child.cc)
saves checkpoints through the C++ API alone: its saves and their bytes are
there too.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import SOURCE_DIR, make_dataset

STOKER = os.environ.get("STOKER_BIN") or shutil.which("stoker")
PROMETHEUS = shutil.which("prometheus")
CKPT_CHILD = os.environ.get("STOKER_METRICS_CKPT_CHILD")

pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed"),
    pytest.mark.skipif(not STOKER, reason="STOKER_BIN is not set (run through ctest)"),
]

CHILD = r"""
import json, sys, time
import numpy as np
import stoker
metrics_dir, dataset, ckpt = sys.argv[1:4]
stoker.metrics.enable(dir=metrics_dir, interval=0.2, job="ptest", rank=0)
stoker.metrics.start()
loader = stoker.Loader(dataset, 16, threads=2)
for batch in loader:
    with stoker.phase("compute"):
        time.sleep(0.002)
    stoker.metrics.step()
try:
    stoker.Loader(dataset + "-missing", 16)
except stoker.NotFoundError:
    pass
stoker.save({"w": np.ones(1000, dtype=np.float32)}, ckpt, step=1)
stoker.save({"w": np.ones(2000, dtype=np.float32)}, ckpt, step=2, async_=True).wait()
print(json.dumps(loader.stats()), flush=True)
sys.stdin.read()  # alive, with its series, until the test closes stdin
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(what, check, timeout=30):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Prom:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr):
        url = self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        doc = json.loads(get(url))
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def value(self, expr):
        r = self.query(expr)
        assert len(r) == 1, f"{expr}: {r}"
        return float(r[0]["value"][1])


@pytest.fixture
def stack(tmp_path):
    """(exporter port, Prom, metrics dir); everything stopped afterwards."""
    metrics_dir = tmp_path / "metrics"
    exporter_port, prom_port = free_port(), free_port()
    cmd = [STOKER, "exporter", "--listen", f"127.0.0.1:{exporter_port}", "--dir",
           str(metrics_dir), "--watch", str(tmp_path)]
    fake_nvml = os.environ.get("STOKER_FAKE_NVML")
    env = dict(os.environ)
    if fake_nvml:
        cmd += ["--nvml", fake_nvml]
        env["FAKE_NVML_XIDS"] = "0:79,1:48,0:79"  # the stand-in's XID events
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)]
    config = tmp_path / "prometheus.yml"
    # honor_labels: the processes' own `job` label is the one that counts (as
    # for a Pushgateway), not the scrape job's name.
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: stoker-node\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n")
    log = open(tmp_path / "prometheus.log", "w")
    procs.append(subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=log, stderr=log))
    try:
        wait_for("the exporter", lambda: "stoker_node_page_cache_bytes" in get(
            f"http://127.0.0.1:{exporter_port}/metrics"))
        wait_for("prometheus", lambda: "Ready" in get(f"http://127.0.0.1:{prom_port}/-/ready"))
        yield exporter_port, Prom(prom_port), metrics_dir
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def dashboard_queries():
    doc = json.loads((SOURCE_DIR / "dashboards" / "stoker.json").read_text())
    return [(panel["title"], t["expr"]) for panel in doc["panels"] for t in panel["targets"]]


def test_prometheus_scrapes_loader_checkpoint_store_gpu_and_node(stack, tmp_path):
    exporter_port, prom, metrics_dir = stack
    uri, _ = make_dataset(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(metrics_dir), uri, str(tmp_path / "ckpt")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The C++ program's checkpoints go to the Ceph cluster where CI has one
    # (its store series then carry backend="rados" and the pool), else to a
    # folder.
    cxx, cxx_root, cxx_backend, cxx_pool = None, str(tmp_path / "ckpt-cxx"), "posix", ""
    ceph_uri = os.environ.get("STOKER_TEST_STORE_URI", "")
    if ceph_uri.startswith("rados://"):
        base, _, query = ceph_uri.partition("?")
        cxx_root = f"{base.rstrip('/')}/metrics-{os.getpid()}-{time.time_ns()}"
        cxx_root += f"?{query}" if query else ""
        cxx_backend, cxx_pool = "rados", base[len("rados://"):].split("/")[0]
    if CKPT_CHILD:
        cxx = subprocess.Popen([CKPT_CHILD, str(metrics_dir), cxx_root, "cxx"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    else:
        print("no C++ checkpoint child: STOKER_METRICS_CKPT_CHILD is not set")
    try:
        stats = json.loads(child.stdout.readline() or "null")
        assert stats, child.stderr.read()
        sel = '{job="ptest",rank="0"}'
        # The file is rewritten every 0.2 s, scraped every 1 s.
        wait_for("the saves in Prometheus",
                 lambda: prom.query(f"stoker_checkpoint_completed_total{sel} == 2"))
        assert prom.value(f"stoker_loader_read_bytes_total{sel}") == stats["bytes_read"]
        assert prom.value(f"stoker_loader_delivered_samples_total{sel}") == \
            stats["samples_delivered"]
        assert prom.value(f"stoker_loader_delivered_batches_total{sel}") == \
            stats["batches_delivered"]
        assert prom.value(f"stoker_loader_data_wait_seconds_count{sel}") == \
            stats["batches_delivered"] + 1  # and the end of the epoch
        assert prom.value(f"stoker_checkpoint_saves_total{sel}") == 2
        assert prom.value(f"stoker_checkpoint_failures_total{sel}") == 0
        import stoker

        written = sum(c["bytes"] for c in stoker.Checkpointer(str(tmp_path / "ckpt")).list())
        assert written > 12000  # two saves' tensors and structure documents
        assert prom.value(f"stoker_checkpoint_written_bytes_total{sel}") == written
        assert prom.value(f"stoker_checkpoint_stall_seconds_count{sel}") == 2
        assert prom.value(f'stoker_store_errors_total{{job="ptest",op="read",'
                          f'code="not_found",backend="posix"}}') >= 1
        assert prom.value(f'stoker_store_read_bytes_total{{job="ptest",backend="posix"}}') >= \
            stats["bytes_read"]
        assert prom.value(f'stoker_step_seconds_count{sel}') == stats["batches_delivered"]
        if cxx:
            cxx_bytes = int(cxx.stdout.readline() or 0)
            assert cxx_bytes, cxx.stderr.read()
            csel = '{job="cxx",rank="0"}'
            wait_for("the C++ program's saves in Prometheus",
                     lambda: prom.query(f"stoker_checkpoint_completed_total{csel} == 2"))
            assert prom.value(f"stoker_checkpoint_written_bytes_total{csel}") == cxx_bytes
            assert prom.value(f"stoker_checkpoint_saves_total{csel}") == 2
            assert prom.value(f"stoker_checkpoint_failures_total{csel}") == 0
            assert prom.value(f"stoker_checkpoint_stall_seconds_count{csel}") == 2
            # Its checkpointer's store is metered: chunks, part records,
            # manifests and the root's index went through it.
            assert prom.value(f'stoker_store_written_bytes_total{{job="cxx",backend='
                              f'"{cxx_backend}",pool="{cxx_pool}"}}') > cxx_bytes
        assert prom.value("stoker_exporter_processes") == (2 if cxx else 1)
        assert prom.value("stoker_node_page_cache_bytes") > 0

        # Rates need two scrapes of a changed counter; the process has done
        # its work, so wait for a few scrapes after it.
        time.sleep(3)
        missing = []
        for title, expr in dashboard_queries():
            expr = expr.replace("$__rate_interval", "1m")
            if "stoker_gpu_" in expr and not os.environ.get("STOKER_FAKE_NVML"):
                print(f"skipped (no NVML stand-in): {title}")
                continue
            if not prom.query(expr):
                missing.append(f"{title}: {expr}")
        assert not missing, "dashboard queries without series:\n" + "\n".join(missing)
        if os.environ.get("STOKER_FAKE_NVML"):
            assert prom.value('stoker_gpu_utilization_ratio{gpu="1"}') == 0.5
            assert prom.value('stoker_gpu_clocks_throttled{gpu="0",reason="sw_power_cap"}') == 1
            assert prom.value('stoker_gpu_xid_errors_total{gpu="0",xid="79"}') == 2
            assert prom.value('stoker_gpu_xid_errors_total{gpu="1",xid="48"}') == 1

        # The whole scrape (a process, the node, the GPUs) is clean Prometheus text.
        if shutil.which("promtool"):
            r = subprocess.run(["promtool", "check", "metrics"], capture_output=True, text=True,
                               input=get(f"http://127.0.0.1:{exporter_port}/metrics"))
            assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr

        # Unknown path: 404.
        with pytest.raises(urllib.error.HTTPError) as e:
            get(f"http://127.0.0.1:{exporter_port}/nope")
        assert e.value.code == 404
    finally:
        child.stdin.close()
        child.wait(30)
        if cxx:
            cxx.stdin.close()
            cxx.wait(30)
            if cxx_backend == "rados":
                import stoker

                c = stoker.Checkpointer(cxx_root)
                for name in ("sync", "async"):
                    c.remove(name)
    # The process is gone: so are its series (the exporter drops its file;
    # Prometheus marks them stale at the next scrape).
    assert 'job="ptest"' not in get(f"http://127.0.0.1:{exporter_port}/metrics")
    wait_for("the series to go stale",
             lambda: not prom.query(f'stoker_loader_read_bytes_total{{job="ptest"}}'), timeout=10)
    assert child.returncode == 0, child.stderr.read()
    assert cxx is None or cxx.returncode == 0, cxx.stderr.read()
