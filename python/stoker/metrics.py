"""stoker.metrics: Prometheus metrics of this process and the per-step breakdown.

    import stoker
    stoker.metrics.enable()                    # publish for `stoker exporter`
    stoker.metrics.start("run.jsonl")          # time steps; one JSON line each
    model.register_comm_hook(None, stoker.timed_allreduce_hook)   # DDP
    for batch in loader:                       # data wait: measured by the Loader
        with stoker.phase("compute"):
            loss = model(batch).sum(); loss.backward(); opt.step()
        stoker.metrics.step()                  # the step ends here
    print(stoker.metrics.table())              # data / h2d / compute / comm / checkpoint

The breakdown (C++ StepTimeline) gives each instant of a step to one phase:
comm (the DDP hook's all-reduces), checkpoint (a save's stall, counted by
the metered checkpointer in C++), h2d,
data (the time a Loader's next batch kept the loop waiting), compute; the
rest is "other", so the phases sum to the step. On a GPU, a phase is timed
with CUDA events on the current stream (resolved when the step ends); on a
CPU, by the wall clock.

enable() must come before the Loaders it should meter are made (a Loader made
while metrics are on reads through a metering store and counts its waits).
The variable STOKER_METRICS=1 enables them when stoker is imported.
"""

import contextlib
import os
import time

from . import _stoker

__all__ = ["enable", "disable", "enabled", "exposition", "start", "stop", "step", "totals",
           "table", "phase", "timed_allreduce_hook", "PHASES"]

PHASES = tuple(_stoker._timeline_phases())
_PHASE_INDEX = {name: i for i, name in enumerate(PHASES)}
_pending_events = []  # (phase index, host begin ns, start event, end event) on a GPU


def enable(dir=None, interval=1.0, job=None, rank=None):
    """Publishes this process's metrics for the node's `stoker exporter`: every
    `interval` seconds to DIR/<pid>.prom (DIR: $STOKER_METRICS_DIR or
    /dev/shm/stoker-metrics), labelled with `job` ($STOKER_JOB, $SLURM_JOB_ID,
    $TORCHELASTIC_RUN_ID or "stoker") and `rank` (from the launcher)."""
    if rank is None:
        from .options import distributed_env
        rank = distributed_env().rank
    _stoker._metrics_enable(dir or "", float(interval), job or "", int(rank))


def disable():
    """Stops publishing and removes this process's file."""
    _stoker._metrics_disable()


def enabled():
    return _stoker._metrics_enabled()


def exposition():
    """This process's metrics now, in Prometheus's text format."""
    return _stoker._metrics_exposition()


def start(run_log=None, gpu=None):
    """Starts timing steps; the first begins now. With `run_log`, each step is
    appended to it as a JSON line (for `stoker report`; one file per rank,
    e.g. f"run-{rank}.jsonl"). `gpu`: an NVML device index whose utilisation
    each step records. Starting again begins afresh."""
    _pending_events.clear()
    _stoker._timeline_start(os.fspath(run_log) if run_log else "")
    if gpu is not None:
        _stoker._timeline_set_gpu(int(gpu))


def stop():
    _stoker._timeline_stop()


def step():
    """Ends the current step (and begins the next); returns its breakdown, a
    dict of seconds per phase plus "seconds", "other", "samples"."""
    _resolve_events()
    return _stoker._timeline_mark()


def totals():
    """The steps so far, summed: seconds per phase, "seconds", "step" (count)."""
    return _stoker._timeline_totals()


def table(t=None):
    """The breakdown as a table: each phase's share of the step time."""
    t = totals() if t is None else t
    total = t["seconds"] or 1e-12
    lines = [f"{'phase':<12}{'seconds':>10}{'% of step':>11}{'ms/step':>10}"]
    steps = max(t["step"], 1)
    for name in PHASES + ("other",):
        v = t[name]
        lines.append(f"{name:<12}{v:>10.3f}{100 * v / total:>10.1f}%{1000 * v / steps:>10.2f}")
    lines.append(f"{'step':<12}{t['seconds']:>10.3f}{100.0:>10.1f}%{1000 * t['seconds'] / steps:>10.2f}")
    return "\n".join(lines)


def _cuda_current():
    """torch.cuda, when this process computes on a GPU; else None."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def _resolve_events():
    if not _pending_events:
        return
    for index, begin, start_ev, end_ev in _pending_events:
        end_ev.synchronize()
        elapsed_ns = int(start_ev.elapsed_time(end_ev) * 1e6)
        _stoker._timeline_add(index, begin, begin + elapsed_ns)
    _pending_events.clear()


@contextlib.contextmanager
def phase(name):
    """Times the block as phase `name` (one of PHASES) of the current step."""
    index = _PHASE_INDEX.get(name)
    if index is None:
        raise ValueError(f"unknown phase {name!r}: one of {', '.join(PHASES)}")
    cuda = _cuda_current() if _stoker._timeline_active() else None
    begin = time.monotonic_ns()
    if cuda is None:
        try:
            yield
        finally:
            _stoker._timeline_add(index, begin, time.monotonic_ns())
        return
    start_ev, end_ev = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    start_ev.record()
    try:
        yield
    finally:
        end_ev.record()
        _pending_events.append((index, begin, start_ev, end_ev))


def timed_allreduce_hook(process_group, bucket):
    """A DDP communication hook: the all-reduce of torch's default hook (sum,
    then divide by the world size), timed as the step's `comm` phase.

        model.register_comm_hook(None, stoker.timed_allreduce_hook)
    """
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    cuda = _cuda_current() if _stoker._timeline_active() else None
    begin = time.monotonic_ns()
    start_ev = None
    if cuda is not None:
        start_ev = cuda.Event(enable_timing=True)
        start_ev.record()
    future = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()

    def done(fut):
        if start_ev is not None:
            end_ev = cuda.Event(enable_timing=True)
            end_ev.record()
            _pending_events.append((_PHASE_INDEX["comm"], begin, start_ev, end_ev))
        else:
            _stoker._timeline_add(_PHASE_INDEX["comm"], begin, time.monotonic_ns())
        return fut.value()[0].div_(world)

    return future.then(done)


if os.environ.get("STOKER_METRICS", "") not in ("", "0"):
    enable()
