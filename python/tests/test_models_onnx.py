"""A real model in a class UDF: the tiny ONNX CNN of examples/python/tiny_cnn.py
(built here from random weights, nothing downloaded) over JPEGs, in batches.

Checks what a user of `uc.BatchMapper` relies on: every file gets the model's
answer for that file (the same scores as onnxruntime run directly over the
same preprocessed images, whatever batches the engine forms), and the model
is loaded once per run in the process, also when calls run at once.
"""

import os
import sys
from pathlib import Path
from typing import Any, TypedDict

import pytest

import udfchain as uc

for _mod in ("numpy", "PIL", "onnx", "onnxruntime"):
    pytest.importorskip(_mod, reason=f"{_mod} is not installed (pip install onnx onnxruntime pillow numpy)")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
import tiny_cnn  # noqa: E402

IMAGES = 40
BATCH = 8


class Label(TypedDict):
    cls: int
    score: float


class Classify(uc.BatchMapper):
    def __init__(self, model_path: str | Path, loads: str) -> None:
        self.model_path = model_path
        self.loads = loads

    def setup(self) -> None:
        with open(self.loads, "a") as f:
            f.write(f"{os.getpid()}\n")
        self.session = tiny_cnn.load(self.model_path)

    def process(self, file: list[uc.File]) -> list[Label]:
        assert 1 <= len(file) <= BATCH
        x = np.stack([tiny_cnn.decode(f.read()) for f in file])
        cls, score = tiny_cnn.top1(self.session, x)
        return [{"cls": int(c), "score": float(s)} for c, s in zip(cls, score)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_cnn.build(tmp_path_factory.mktemp("model") / "tiny_cnn.onnx")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("images")
    tiny_cnn.write_jpegs(d, IMAGES, width=96, height=72)
    return d


def expected(model: str, images: Path) -> dict[str, tuple[int, float]]:
    """{name: (class, score)} from onnxruntime directly, all images in one batch."""
    names = sorted(os.listdir(images))
    x = np.stack([tiny_cnn.decode((images / n).read_bytes()) for n in names])
    cls, score = tiny_cnn.top1(tiny_cnn.load(model), x)
    return {n: (int(c), float(s)) for n, c, s in zip(names, cls, score)}


def loads_of(path: Path) -> int:
    return len([line for line in Path(path).read_text().splitlines() if line.strip()])


@pytest.mark.parametrize("concurrency", [None, 2])
def test_batch_mapper_classifies_every_file_with_one_model_load(model: str, images: Path, tmp_path: Path, concurrency: int | None) -> None:
    loads = tmp_path / "loads.txt"
    loads.touch()
    kw: dict[str, Any] = {} if concurrency is None else {"concurrency": concurrency}
    c = (uc.read_storage(str(images))
         .settings(parallel=2)
         .batch_map(label=Classify(model, str(loads)), batch_size=BATCH, **kw))
    rows = c.collect("file", "label")

    assert len(rows) == IMAGES
    want = expected(model, images)
    got = {f.name: (lab["cls"], lab["score"]) for f, lab in rows}
    assert set(got) == set(want)
    for name, (cls, score) in got.items():
        assert 0 <= cls <= 999 and 0 < score <= 1, (name, cls, score)
        assert cls == want[name][0], name
        assert abs(score - want[name][1]) <= 1e-5, (name, score, want[name][1])
    assert len({s for _, s in got.values()}) > IMAGES // 2  # the answers are per image
    assert loads_of(loads) == 1


def test_chain_setup_value_reaches_a_batch_function_once(model: str, images: Path, tmp_path: Path) -> None:
    loads = tmp_path / "loads.txt"
    loads.touch()

    def load() -> Any:
        with open(loads, "a") as f:
            f.write(f"{os.getpid()}\n")
        return tiny_cnn.load(model)

    def top1(file: list[uc.File], model: Any) -> list[int]:
        x = np.stack([tiny_cnn.decode(f.read()) for f in file])
        return [int(c) for c in tiny_cnn.top1(model, x)[0]]

    rows = (uc.read_storage(str(images))
            .setup(model=load)
            .batch_map(cls=top1, batch_size=BATCH)
            .collect("file", "cls"))
    want = expected(model, images)
    assert {f.name: c for f, c in rows} == {n: c for n, (c, _) in want.items()}
    assert loads_of(loads) == 1
