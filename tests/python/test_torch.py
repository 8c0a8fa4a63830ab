"""torch: zero-copy tensors, the IterableDataset in a DataLoader."""

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402
from stoker.torch import StokerIterableDataset  # noqa: E402


def test_torch_format_gives_zero_copy_tensors(dataset):
    uri, src = dataset
    loader = stoker.Loader(uri, 16, format="torch", rank=0, world_size=1)
    total = 0
    for batch in loader:
        address, size = loader._impl.last_buffer
        ids, labels, images = batch["sample_ids"], batch["label"], batch["image"]
        assert ids.dtype == torch.int64 and labels.dtype == torch.int64
        assert batch["padding"].dtype == torch.bool
        assert images.offsets.dtype == torch.int64 and images.data.dtype == torch.uint8
        for t in (ids, labels, batch["padding"], images.offsets, images.data):
            assert address <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() \
                <= address + size
        for k, sid in enumerate(ids.tolist()):
            data, label = src.expected[sid]
            assert images[k].numpy().tobytes() == data
            assert labels[k].item() == label
        total += len(ids)
    assert total == len(src)


def test_tensors_outlive_the_loader(dataset):
    uri, src = dataset
    loader = stoker.Loader(uri, 32, format="torch", fields=["label"], rank=0, world_size=1)
    kept = [(b["sample_ids"], b["label"]) for b in loader]
    loader.close()
    del loader
    gc.collect()
    _ = [torch.full((1 << 16,), 7, dtype=torch.uint8) for _ in range(32)]
    for ids, labels in kept:
        assert labels.tolist() == [src.expected[i][1] for i in ids.tolist()]


def test_dlpack_from_numpy_batches_is_zero_copy(dataset):
    uri, _ = dataset
    loader = stoker.Loader(uri, 16, rank=0, world_size=1)
    batch = next(iter(loader))
    labels = batch["label"]
    t = torch.utils.dlpack.from_dlpack(labels.__dlpack__())
    assert t.data_ptr() == labels.__array_interface__["data"][0]
    assert t.tolist() == labels.tolist()


def test_training_step_on_a_batch(dataset):
    uri, _ = dataset
    loader = stoker.Loader(uri, 16, format="torch", rank=0, world_size=1)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in loader:
        # A feature from the raw bytes: the first 4 bytes of each sample.
        x = torch.stack([batch["image"][k][:4].float() for k in range(len(batch["label"]))])
        loss = torch.nn.functional.cross_entropy(model(x / 255), batch["label"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)


def test_iterable_dataset_in_a_dataloader(dataset):
    uri, src = dataset
    ds = StokerIterableDataset(uri, 10, seed=2, rank=0, world_size=1)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    for epoch in range(2):
        ds.set_epoch(epoch)
        ids = []
        for batch in dl:
            assert isinstance(batch["label"], torch.Tensor)
            assert isinstance(batch["image"], stoker.BytesColumn)
            ids += batch["sample_ids"].tolist()
        assert sorted(ids) == list(range(len(src)))
    assert len(ds) == len(dl) == -(-len(src) // 10)
    state = ds.state_dict()
    assert (state["epoch"], state["position"]) == (1, len(src))


def test_iterable_dataset_resumes(dataset):
    uri, _ = dataset
    full = [b["sample_ids"].tolist() for b in StokerIterableDataset(uri, 10, rank=0, world_size=1)]
    ds = StokerIterableDataset(uri, 10, rank=0, world_size=1)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None))
    head = [next(it)["sample_ids"].tolist() for _ in range(4)]
    state = ds.state_dict()
    ds2 = StokerIterableDataset(loader=stoker.Loader(uri, 10, format="torch", rank=0,
                                                      world_size=1))
    ds2.load_state_dict(state)
    tail = [b["sample_ids"].tolist() for b in torch.utils.data.DataLoader(ds2, batch_size=None)]
    assert head + tail == full


def test_dataloader_workers_are_refused_clearly(dataset):
    uri, _ = dataset
    ds = StokerIterableDataset(uri, 10, rank=0, world_size=1)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, timeout=60)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(dl))


def test_iterable_dataset_arguments():
    with pytest.raises(TypeError, match="needs uri and batch_size"):
        StokerIterableDataset()
    with pytest.raises(TypeError, match="stoker.Loader"):
        StokerIterableDataset(loader=object())
