"""stoker: keeps GPUs fed. Packed shards on storage -> batches in Python.

    import stoker
    stoker.pack("train/", "/data/train-ds")             # ImageFolder -> dataset
    loader = stoker.Loader("/data/train-ds", batch_size=256, decode="image",
                           format="torch")               # rank/world from torchrun etc.
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:                             # dict of zero-copy tensors
            images, labels = batch["image"], batch["label"]

    stoker.save(model.state_dict(), "/ckpt/run", step=100)   # checkpoints, beside
    model.load_state_dict(stoker.load("/ckpt/run"))          # torch.save/torch.load

See stoker.Loader for batches, epochs and resume, stoker.checkpoint for
save and load, stoker.errors for the exceptions, and stoker.torch for a torch
IterableDataset.
"""

from . import _stoker
from . import errors
from .errors import *  # noqa: F401,F403

errors._register(_stoker)

from .checkpoint import Checkpointer, SaveHandle, ShardedTensor, load, save  # noqa: E402
from .dataset import inspect, pack, verify  # noqa: E402
from .loader import BytesColumn, DistributedEnv, Loader, distributed_env  # noqa: E402
from .writer import Writer, commit_parts  # noqa: E402
from .mix import Mix, mix_counts  # noqa: E402
from .importers import export_webdataset, import_jsonl, import_megatron, import_webdataset  # noqa: E402,E501
from . import metrics  # noqa: E402
from .metrics import phase, timed_allreduce_hook  # noqa: E402

__version__ = _stoker.__version__

__all__ = [
    "Writer",
    "Mix", "mix_counts",
    "commit_parts",
    "import_webdataset", "import_jsonl", "import_megatron", "export_webdataset",
    "Loader", "BytesColumn", "DistributedEnv", "distributed_env", "pack", "inspect", "verify",
    "save", "load", "Checkpointer", "SaveHandle", "ShardedTensor",
    "metrics", "phase", "timed_allreduce_hook",
    "StokerError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError",
    "PermissionDeniedError", "CorruptionError", "UnsupportedError", "StorageIOError",
    "StorageTimeoutError", "UnavailableError", "NoSpaceError", "CancelledError",
    "OutOfRangeError", "InternalError",
]
