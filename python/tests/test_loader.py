"""The training loader from Python: exactly-once epochs across workers,
shuffles per (seed, epoch), bytes of File columns, transform."""

import pytest

import udfchain as uc
from conftest import sha
from pathlib import Path


def ids(loader: uc.Loader, epoch: int) -> list[int]:
    return [int(i) for b in loader.epoch_batches(epoch) for i in b["id"]]


def test_every_row_once_per_epoch_across_workers() -> None:
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


def test_dataset_with_bytes_and_transform(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files
    uc.read_storage(str(d)).save("shards")
    l = uc.Loader("shards", batch_size=5, with_bytes=True, prefetch_partitions=2,
                  transform=lambda b: {"path": [f.path for f in b["file"]], "h": [sha(x) for x in b["bytes"]]})
    got: dict[str, str] = {}
    for batch in l:
        assert len(batch["path"]) <= 5
        got.update(zip(batch["path"], batch["h"]))
    assert got == {k: sha(v) for k, v in data.items()}


def test_loader_is_a_torch_iterable_dataset_in_a_dataloader() -> None:
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


def test_with_images_gives_each_batch_as_one_uint8_array_equal_to_pillow(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    Image = pytest.importorskip("PIL.Image")
    d = tmp_path / "imgs"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(11):
        # Smooth images (a gradient plus a little noise), lossless: the
        # loader's pixels are compared with Pillow's bilinear resize.
        y, x = np.mgrid[0:40 + i, 0:50 + 2 * i]
        rgb = np.stack([x * 3 % 256, y * 5 % 256, (x + y) % 256], -1) + rng.integers(0, 3, (40 + i, 50 + 2 * i, 3))
        Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(d / f"{i:02}.png")
    chain = uc.read_storage(str(d))
    loader = chain.to_pytorch(batch_size=4, columns=["file"]).with_images("file", size=(24, 16), mode="RGB")
    seen = 0
    for batch in loader:
        arr = batch["image"]
        assert isinstance(arr, np.ndarray) and arr.dtype == np.uint8
        assert arr.shape == (len(batch["file"]), 16, 24, 3)
        for f, got in zip(batch["file"], arr):
            want = np.asarray(Image.open(d / f.path.rsplit("/", 1)[-1]).convert("RGB").resize((24, 16), Image.BILINEAR))
            assert np.abs(got.astype(int) - want.astype(int)).mean() < 1.0, f.path
            seen += 1
    assert seen == 11
    gray = uc.Loader(chain, batch_size=11, with_images={"size": (8, 8), "mode": "L", "out": "px"})
    (only,) = list(gray)
    assert only["px"].shape == (11, 8, 8, 1)
    with pytest.raises(TypeError, match="unknown arguments"):
        uc.Loader(chain, with_images={"sise": (8, 8)})
    with pytest.raises(uc.UdfchainError, match="with_images size"):
        list(uc.Loader(chain, with_images={"size": (0, 8)}))
