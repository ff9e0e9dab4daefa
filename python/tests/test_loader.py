"""The training loader from Python: exactly-once epochs across workers,
shuffles per (seed, epoch), bytes of File columns, transform."""

import pytest

import udfchain as uc
from conftest import sha


def ids(loader, epoch):
    return [int(i) for b in loader.epoch_batches(epoch) for i in b["id"]]


def test_every_row_once_per_epoch_across_workers():
    c = uc.read_values(id=list(range(103)))
    for epoch in (0, 1):
        seen = []
        for w in range(3):
            l = uc.Loader(c, batch_size=8, partition_rows=10, shuffle=7, worker=w, num_workers=3)
            seen += ids(l, epoch)
        assert sorted(seen) == list(range(103))
    one = c.to_pytorch(batch_size=8, partition_rows=10, shuffle=7)
    e0, e1 = ids(one, 0), ids(one, 1)
    assert sorted(e0) == sorted(e1) == list(range(103))
    assert e0 != e1 and e0 != list(range(103))
    assert ids(one, 0) == e0  # the same (seed, epoch), the same order


def test_dataset_with_bytes_and_transform(files):
    d, data = files
    uc.read_storage(str(d)).save("shards")
    l = uc.Loader("shards", batch_size=5, with_bytes=True, prefetch_partitions=2,
                  transform=lambda b: {"path": [f.path for f in b["file"]], "h": [sha(x) for x in b["bytes"]]})
    got = {}
    for batch in l:
        assert len(batch["path"]) <= 5
        got.update(zip(batch["path"], batch["h"]))
    assert got == {k: sha(v) for k, v in data.items()}


def test_loader_is_a_torch_iterable_dataset_in_a_dataloader():
    torch = pytest.importorskip(
        "torch", reason="torch is not installed (its PyPI wheel and CUDA dependencies are several GB)"
    )
    uc.read_values(id=list(range(50))).save("ids")  # by name: DataLoader workers unpickle it
    loader = uc.Loader("ids", batch_size=4, partition_rows=10, shuffle=3)
    assert isinstance(loader, torch.utils.data.IterableDataset)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        dl = torch.utils.data.DataLoader(loader, batch_size=None, num_workers=2, multiprocessing_context="spawn")
        seen = [int(i) for b in dl for i in b["id"]]
        assert sorted(seen) == list(range(50))  # every row once across the two workers
