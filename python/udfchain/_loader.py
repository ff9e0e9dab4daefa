"""`Loader`: the Rust training loader for a Python training loop.

Guarantees (the Rust loader's): every row once per epoch across ranks and
workers, a shuffle drawn from (seed, epoch), partitions fetched ahead while
the trainer works. Rank and world size come from `torch.distributed` when it
is initialized, worker id and count from `torch.utils.data.get_worker_info()`
inside a DataLoader worker, unless given. Batches are dicts: numeric columns
as numpy arrays (when numpy imports), others as lists (File columns as
`udfchain.File`, the `with_bytes` column as bytes), the `with_images` column
as one uint8 array (N, H, W, C); `transform` maps each
batch. `Loader` is a torch `IterableDataset` when torch imports (iterate it,
or hand it to a DataLoader with `batch_size=None`), a plain iterable
otherwise. The engine starts in the process that iterates: DataLoader
workers forked before any udfchain run work; after one, they fail at once
(use `multiprocessing_context="spawn"`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ._pyarrow import pa

from . import _internal
from ._file import files_of, is_file_type

if TYPE_CHECKING:
    from ._chain import Chain

    _Base = object
    torch: Any
else:
    try:  # torch is optional
        import torch
        from torch.utils.data import IterableDataset as _Base
    except Exception:  # pragma: no cover - depends on the environment
        torch = None
        _Base = object

Batch = dict[str, Any]
"""A batch: {column: values} (numpy arrays, lists, or one uint8 array of images)."""


def _batch(ipc: bytes) -> Batch:
    rb = pa.ipc.open_stream(ipc).read_next_batch()
    out: Batch = {}
    for name, col in zip(rb.schema.names, rb.columns):
        t = col.type
        if is_file_type(t):
            out[name] = files_of(col, None)
        elif isinstance(t, pa.FixedShapeTensorType) and col.null_count == 0:
            # with_images: one (N, H, W, C) uint8 array viewing the batch, no copy.
            out[name] = col.to_numpy_ndarray()
        elif (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) and col.null_count == 0:
            try:
                out[name] = col.to_numpy(zero_copy_only=False)
            except Exception:
                out[name] = col.to_pylist()
        else:
            out[name] = col.to_pylist()
    return out


def _images(spec: bool | str | dict[str, Any] | None) -> tuple[str, str, tuple[int, int], str] | None:
    """`with_images=`: True (the `file` column at 224x224 RGB into `image`),
    a column name, or a dict of `with_images`'s arguments."""
    if spec is None or spec is False:
        return None
    if spec is True:
        spec = {}
    elif isinstance(spec, str):
        spec = {"file": spec}
    spec = dict(spec)
    unknown = set(spec) - {"file", "size", "mode", "out"}
    if unknown:
        raise TypeError(f"with_images: unknown arguments {sorted(unknown)} (file, size, mode, out)")
    width, height = spec.get("size", (224, 224))
    return (spec.get("file", "file"), spec.get("out", "image"), (int(width), int(height)), spec.get("mode", "RGB"))


def _split() -> tuple[int, int, int, int]:
    """(rank, world_size, worker, num_workers) from torch, or a single process."""
    rank, world, worker, workers = 0, 1, 0, 0
    if torch is not None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        info = torch.utils.data.get_worker_info()
        if info is not None:
            worker, workers = info.id, info.num_workers
    return rank, world, worker, workers


class Loader(_Base):
    """`Loader(chain_or_dataset_name, batch_size=64, shuffle=seed, with_bytes=True, ...)`:
    the rows of a chain or a saved dataset (`version=`) in batches of
    `batch_size` rows for a training loop, `partition_rows` rows per
    partition and `prefetch_partitions` partitions fetched ahead
    (`parallel_requests` downloads each), shuffled by seed `shuffle` and the
    epoch (`set_epoch`); `drop_last` drops a short last batch; `columns`
    keeps only those; `with_bytes=True` (or `(file_col, out_col)`) adds the
    bytes of the `file` column, `with_images` decoded images (see
    `with_images`); `transform` maps each batch. Rank, world size, worker
    and their count come from torch unless given."""

    def __init__(
        self,
        source: Chain | str,
        *,
        version: int | None = None,
        batch_size: int = 64,
        partition_rows: int = 1000,
        prefetch_partitions: int = 1,
        parallel_requests: int = 1,
        shuffle: int | None = None,
        drop_last: bool = False,
        columns: Iterable[str] | None = None,
        with_bytes: bool | tuple[str, str] | None = None,
        with_images: bool | str | dict[str, Any] | None = None,
        transform: Callable[[Batch], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        worker: int | None = None,
        num_workers: int | None = None,
    ) -> None:
        self._source = source
        self._version = version
        self._kw: dict[str, Any] = dict(
            partition_rows=partition_rows,
            prefetch_partitions=prefetch_partitions,
            parallel_requests=parallel_requests,
            batch_size=batch_size,
            drop_last=drop_last,
            columns=None if columns is None else list(columns),
            with_bytes=("file", "bytes") if with_bytes is True else (tuple(with_bytes) if with_bytes else None),
            with_images=_images(with_images),
            shuffle=shuffle,
        )
        self._split = (rank, world_size, worker, num_workers)
        self.transform = transform
        self.epoch = 0

    def with_images(
        self, file: str = "file", size: tuple[int, int] = (224, 224), mode: str = "RGB", out: str = "image"
    ) -> Loader:
        """Delivers column `file` also as decoded images in column `out`: each
        file decoded, converted to `mode` ("RGB", "L", "RGBA") and resized to
        `size = (width, height)` on the engine's threads while partitions are
        fetched ahead, so a batch's `out` is one uint8 numpy array
        (N, height, width, channels), no decode in DataLoader workers."""
        self._kw["with_images"] = _images({"file": file, "size": size, "mode": mode, "out": out})
        return self

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (its shuffle and order)."""
        self.epoch = epoch

    def _rust(self) -> _internal.Loader:
        auto = _split()
        rank, world, worker, workers = (given if given is not None else a for given, a in zip(self._split, auto))
        kw: dict[str, Any] = dict(self._kw, rank=rank, world_size=world, worker=worker, num_workers=workers)
        if isinstance(self._source, str):
            return _internal.Loader(dataset=self._source, version=self._version, **kw)
        return _internal.Loader(chain=self._source._c, **kw)

    def epoch_batches(self, epoch: int) -> Iterator[Any]:
        """The batches of `epoch` (dicts of column -> values)."""
        for ipc in self._rust().epoch(epoch):
            b = _batch(ipc)
            yield self.transform(b) if self.transform is not None else b

    def __iter__(self) -> Iterator[Any]:
        """The batches of the epoch `set_epoch` chose (0 at first)."""
        return self.epoch_batches(self.epoch)
