"""stoker.Mix (issue 36): shares within one window of weight x batch in every
global batch, the same global stream on another world size after a resume,
a weight schedule, and every bad input named."""

import math

import numpy as np
import pytest

import stoker


def make_source(tmp_path, name, docs, seed):
    rng = np.random.default_rng(seed)
    uri = str(tmp_path / name)
    with stoker.Writer(uri, fields={"tokens": "uint16[*]"}, shard_bytes=8192) as w:
        for d in range(docs):
            w.write({"tokens": rng.integers(0, 60000, int(rng.integers(1, 100)),
                                            dtype=np.uint16)})
    return uri


@pytest.fixture
def sources(tmp_path):
    return [(make_source(tmp_path, "a", 15, 1), 0.5), (make_source(tmp_path, "b", 200, 2), 0.3),
            (make_source(tmp_path, "c", 600, 3), 0.2)]


def steps_of(mixes, n):
    """n steps of each rank's Mix, joined in rank order: [(source, window), ...] a step."""
    out = []
    for _ in range(n):
        step = []
        for m in mixes:
            b = next(m)
            step += list(zip(b["source"].tolist(), b["sample_ids"].tolist()))
        out.append(step)
    return out


def test_every_global_batch_holds_each_share(sources):
    B, L = 20, 24
    mix = stoker.Mix(sources, batch_size=B, sequence_length=L, seed=4)
    weights = [w for _, w in sources]
    for step in range(30):
        batch = next(mix)
        assert batch["tokens"].shape == (B, L + 1) and batch["tokens"].dtype == np.int64
        counts = np.bincount(batch["source"], minlength=3).tolist()
        assert counts == stoker.mix_counts(weights, B, 4, step)
        for i, w in enumerate(weights):
            assert abs(counts[i] - w * B) <= 1
    stats = mix.stats()
    assert stats["steps"] == 30 and sum(stats["windows"]) == 30 * B
    assert stats["windows"][0] > stats["epoch_windows"][0]  # the small source repeats


def test_resume_on_another_world_size(sources):
    opts = dict(batch_size=12, sequence_length=16, seed=2)
    whole = steps_of([stoker.Mix(sources, **opts)], 8)
    ranks = [stoker.Mix(sources, rank=r, world_size=4, **opts) for r in range(4)]
    first = steps_of(ranks, 3)
    state = ranks[0].state_dict()
    assert state["step"] == 3 and len(state["positions"]) == 3
    resumed = [stoker.Mix(sources, rank=r, world_size=3, state=state, **opts) for r in range(3)]
    assert first + steps_of(resumed, 5) == whole


def test_schedule_and_torch(sources):
    torch = pytest.importorskip("torch")
    mix = stoker.Mix(sources, batch_size=10, sequence_length=8, schedule=[(2, [1, 1, 8])],
                     format="torch", dtype="int32")
    for step in range(4):
        b = next(mix)
        assert b["tokens"].dtype == torch.int32 and b["tokens"].shape == (10, 9)
        want = stoker.mix_counts([0.5, 0.3, 0.2] if step < 2 else [1, 1, 8], 10, 0, step)
        assert torch.bincount(b["source"], minlength=3).tolist() == want
    assert mix.weights_at(5) == [1, 1, 8]


def test_bad_input_is_named(sources):
    bad = list(sources)
    bad[1] = (sources[1][0], 0)
    with pytest.raises(stoker.InvalidArgumentError, match=r"source 1 \(.*b\): weight"):
        stoker.Mix(bad, batch_size=4, sequence_length=8)
    bad[1] = (sources[1][0], math.nan)
    with pytest.raises(stoker.InvalidArgumentError, match="source 1"):
        stoker.Mix(bad, batch_size=4, sequence_length=8)
    with pytest.raises(stoker.InvalidArgumentError, match="source 2 .*sequence_length 16"):
        stoker.Mix(sources[:2] + [{"uri": sources[2][0], "weight": 1, "sequence_length": 16}],
                   batch_size=4, sequence_length=8)
    mix = stoker.Mix(sources, batch_size=4, sequence_length=8)
    next(mix)
    state = mix.state_dict()
    other = [(u, 1.0) for u, _ in sources]
    with pytest.raises(stoker.InvalidArgumentError, match="weights"):
        stoker.Mix(other, batch_size=4, sequence_length=8, state=state)
    with pytest.raises(stoker.InvalidArgumentError, match="dataset"):
        stoker.Mix(sources[::-1], batch_size=4, sequence_length=8, state=state)
    with pytest.raises(stoker.InvalidArgumentError, match="not a stoker.Mix state"):
        stoker.Mix(sources, batch_size=4, sequence_length=8, state={"step": 1})
