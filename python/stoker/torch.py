"""torch integration: stoker.Loader as a torch.utils.data.IterableDataset.

stoker.Loader is already an iterable of batches of torch tensors
(``format="torch"``) and is meant to be used directly in a training loop.
For code that expects a Dataset (Lightning, trainer libraries), wrap it:

    from stoker.torch import StokerIterableDataset
    ds = StokerIterableDataset("/data/train-ds", batch_size=256, decode="image")
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)

``batch_size=None`` because each item is already a batch, and
``num_workers=0`` because stoker has its own workers (threads=...) and
reads ahead by itself; DataLoader worker processes would fork the loader,
which a forked child cannot use (it raises RuntimeError). ``pin_memory=True``
works as usual (it copies each batch into pinned memory).
"""

import torch.utils.data

from .loader import Loader

__all__ = ["StokerIterableDataset"]


class StokerIterableDataset(torch.utils.data.IterableDataset):
    """An IterableDataset whose items are stoker batches (dicts of tensors).

    Takes the arguments of stoker.Loader (``format`` defaults to "torch"), or
    an existing Loader as ``loader=``. Epochs, ``len()``, ``set_epoch``,
    ``state_dict`` and ``load_state_dict`` are the Loader's.
    """

    def __init__(self, uri=None, batch_size=None, *, loader=None, **loader_kwargs):
        super().__init__()
        if loader is not None:
            if uri is not None or batch_size is not None or loader_kwargs:
                raise ValueError("give either loader= or the Loader's arguments, not both")
            if not isinstance(loader, Loader):
                raise TypeError(f"loader must be a stoker.Loader, not {type(loader).__name__}")
            self.loader = loader
        else:
            if uri is None or batch_size is None:
                raise TypeError("StokerIterableDataset needs uri and batch_size (or loader=)")
            loader_kwargs.setdefault("format", "torch")
            self.loader = Loader(uri, batch_size, **loader_kwargs)

    def __iter__(self):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(
                "StokerIterableDataset runs in the main process: use "
                "DataLoader(dataset, batch_size=None, num_workers=0); stoker has its own "
                "workers (Loader(threads=...)) and reads ahead by itself")
        return iter(self.loader)

    def __len__(self):
        return len(self.loader)

    def set_epoch(self, epoch):
        self.loader.set_epoch(epoch)

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)
