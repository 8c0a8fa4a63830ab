"""The next epoch's read-ahead is C++'s (Loader::Prefetch, issue 35): when an
epoch ends the loader starts reading the next one, and the next iter() of
that epoch keeps those reads instead of starting over. Asserted on the
counters: the shards read, not the time taken."""

import time

import stoker
from conftest import collect_ids


def wait_for_reads(loader, more_than):
    """Waits (a condition, up to a minute) until the loader read more shards."""
    deadline = time.monotonic() + 60
    while loader.stats()["shards_read"] <= more_than:
        assert time.monotonic() < deadline, "no read was issued"
        time.sleep(0.001)


def test_the_next_epochs_reads_are_issued_at_the_end_and_kept(dataset):
    uri, src = dataset
    with stoker.Loader(uri, 10, rank=0, world_size=1, read_unit="shard") as loader:
        wait_for_reads(loader, 0)  # Open's start is read ahead too
        epoch0 = collect_ids(loader)
        shards = loader.stats()["shards_read"]
        assert sum(map(len, epoch0)) == len(src)
        # The epoch ended: epoch 1's reads are under way before its iter().
        wait_for_reads(loader, shards)
        loader.set_epoch(1)
        epoch1 = collect_ids(loader)
        assert loader.stats()["shards_read"] == 2 * shards, "epoch 1 was started over"
        assert epoch1 != epoch0
    with stoker.Loader(uri, 10, rank=0, world_size=1, read_unit="shard") as fresh:
        fresh.set_epoch(1)
        assert collect_ids(fresh) == epoch1


def test_another_epoch_than_the_one_read_ahead_is_started(dataset):
    uri, src = dataset
    with stoker.Loader(uri, 10, rank=0, world_size=1, read_unit="shard") as loader:
        collect_ids(loader)
        loader.set_epoch(5)  # not epoch 1, which was read ahead
        got = collect_ids(loader)
    with stoker.Loader(uri, 10, rank=0, world_size=1, read_unit="shard") as fresh:
        fresh.set_epoch(5)
        assert collect_ids(fresh) == got
