"""The GIL is released while stoker waits: other Python threads keep running.

No clock decides these tests. Each holds stoker blocked in C++ behind a gate
that only the test opens: a child process holds the node cache's fetch lock
(a loader's reads wait on it, as they wait on another rank's fetch) or is the
only writer of a FIFO that pack reads its list of sources from; a save or a
load waits inside its store, in a gate of the test builds' hooks
(_stoker._testing.StoreGate, python/testing_binding.cc). While the call is
blocked, the test's own thread must run Python; only then does it open the
gate. If the call kept the GIL, the test's thread could not run until the
gate gave up on it (DEADMAN_S, a bound on a hang, not a speed) and opened
itself, and the test fails saying so.
"""

import contextlib
import os
import queue
import subprocess
import sys
import threading

import pytest

import stoker
from stoker import _stoker

DEADMAN_S = 60
GAVE_UP = 3  # the child's exit code when the deadman opened the gate

# Holds an fcntl lock on the whole file argv[1] (created as the cache creates
# it) until told "go" on stdin or the deadman passes. A process-associated
# lock conflicts with the cache's OFD locks on every byte: each shard's fetch
# waits on it in the kernel.
HOLD_LOCK = f"""
import fcntl, select, sys
f = open(sys.argv[1], "a+")
fcntl.lockf(f, fcntl.LOCK_EX)
print("held", flush=True)
told = select.select([sys.stdin], [], [], {DEADMAN_S})[0]
sys.exit(0 if told else {GAVE_UP})
"""

# The writer of the FIFO argv[1]: its open returns once a reader has opened
# the FIFO; argv[2] is written only when told "go" (or by the deadman).
FEED_FIFO = f"""
import select, sys
with open(sys.argv[1], "w") as f:
    print("open", flush=True)
    told = select.select([sys.stdin], [], [], {DEADMAN_S})[0]
    f.write(sys.argv[2])
sys.exit(0 if told else {GAVE_UP})
"""


@contextlib.contextmanager
def gate(script, *args):
    """The child process running `script`: the gate, closed until open_gate."""
    child = subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def open_gate(child, call, what):
    """Opens the gate after `call` was seen still blocked; what it returned."""
    assert not call.finished, \
        f"{what} finished before this thread could run: it kept the GIL while it waited"
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.wait() == 0, "the gate was opened by the child's deadman, not by this thread"
    return call.join()


class Call:
    """fn() on a thread of its own; what it returned or raised."""

    def __init__(self, fn):
        self.result, self.error, self.finished = None, None, False
        self.thread = threading.Thread(target=self.run, args=(fn,), daemon=True)

    def run(self, fn):
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 -- reported by the test's thread
            self.error = e
        self.finished = True

    def join(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def no_forced_switch():
    # Python takes the GIL away from a thread only after the switch interval;
    # with an hour, a thread gives it up only where it releases it itself (in
    # a blocking call, or where stoker's binding releases it), so the thread
    # that starts another gets it back only once that one has.
    old = sys.getswitchinterval()
    sys.setswitchinterval(3600)
    yield
    sys.setswitchinterval(old)


def test_waiting_for_a_batch_releases_the_gil(tmp_path, no_forced_switch):
    for i in range(64):
        folder = tmp_path / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.bin").write_bytes(bytes([i]) * 4096)
    info = stoker.pack(tmp_path / "src", tmp_path / "ds")
    cache = tmp_path / "cache"
    (cache / info["dataset_id"]).mkdir(parents=True)
    with gate(HOLD_LOCK, cache / info["dataset_id"] / "fetch.lock") as child:
        assert child.stdout.readline() == "held\n"
        # Whole-shard reads through the cache: each waits on the held lock.
        loader = stoker.Loader(tmp_path / "ds", 16, cache=cache, read_unit="shard", threads=1,
                               rank=0, world_size=1)
        it = iter(loader)
        # From start() to the binding's next() the thread runs Python that
        # blocks nowhere, so start() returns (this thread has the GIL again)
        # only once next() has released it, or once next() returned.
        call = Call(lambda: next(it))
        call.thread.start()
        batch = open_gate(child, call, "next()")
    assert len(batch["label"]) == 16


def test_pack_releases_the_gil(tmp_path, no_forced_switch):
    for i in range(100):
        (tmp_path / f"{i:03d}.bin").write_bytes(i.to_bytes(4, "little"))
    listing = "".join(f"{i:03d}.bin {i % 3}\n" for i in range(100))
    fifo = tmp_path / "list.txt"
    os.mkfifo(fifo)
    with gate(FEED_FIFO, fifo, listing) as child:
        call = Call(lambda: stoker.pack(fifo, tmp_path / "ds", threads=1))
        call.thread.start()
        # The child's open returns once pack, in C++, has opened the list;
        # pack then waits in the kernel for its lines. This thread gets past
        # readline() only if pack lets go of the GIL while it waits.
        assert child.stdout.readline() == "open\n"
        info = open_gate(child, call, "pack")
    assert info["samples"] == 100


def python_runs_here():
    """A round trip through another Python thread: this thread and that one
    both ran Python."""
    there, back = queue.Queue(), queue.Queue()
    echo = threading.Thread(target=lambda: back.put(there.get() + 1), daemon=True)
    echo.start()
    there.put(41)
    assert back.get(timeout=DEADMAN_S) == 42
    echo.join()


def test_save_and_load_release_the_gil(tmp_path, no_forced_switch):
    if not hasattr(_stoker, "_testing"):
        pytest.skip("a build without the tests' hooks (STOKER_BUILD_TESTS off)")
    import torch

    root = str(tmp_path / "ckpt")
    state = {f"t{i}": torch.full((1 << 10,), float(i)) for i in range(4)}
    c = stoker.Checkpointer(root)
    gate = _stoker._testing.StoreGate(DEADMAN_S)
    c._impl = _stoker._testing.gated_checkpointer(root, c._options, gate)
    try:
        for what, fn in (("save", lambda: c.save(state, "g")), ("load", lambda: c.load("g"))):
            gate.arm()
            call = Call(fn)
            # start() returns once the call's thread let go of the GIL: in
            # the store (the gate), or earlier, or once it finished.
            call.thread.start()
            held, where = gate.wait_held(DEADMAN_S)
            assert held, f"{what} never reached its store"
            assert not call.finished, f"{what} finished before this thread could run"
            python_runs_here()  # while the call waits in the store
            assert not call.finished
            gate.release()
            result = call.join()
            assert not gate.gave_up, \
                f"{what} ({where}) kept the GIL while it waited: the gate's deadman let it go"
        assert all(torch.equal(result[k], v) for k, v in state.items())
    finally:
        c.close()
