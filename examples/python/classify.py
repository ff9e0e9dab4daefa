#!/usr/bin/env python3
"""Classify images with an ONNX model, loaded once per worker, in batches.

    python examples/python/classify.py                   # 64 generated JPEGs in a temp dir
    python examples/python/classify.py s3://bucket/imgs/ --processes 2 --concurrency 2

Needs the `udfchain` package (`pip install ./python`) and `onnx onnxruntime
pillow numpy`. The model is the tiny CNN of `tiny_cnn.py`, built here from
random weights into the run's temp dir (nothing is downloaded): its classes
mean nothing, its work is a real CNN's.

The chain: images from a storage URI (default: a temp dir of 64 photo-like
JPEGs this script writes) -> `Classify`, a `uc.BatchMapper` whose `setup()`
loads the model once per worker and whose `process(file)` gets 32 files per
call, decodes and resizes them (Pillow), stacks them into one (N, 3, 224,
224) array and runs the model once -> the top-1 class and its score per file
-> saved as dataset `classified`. It prints some rows and checks its own
output: every file has a class in 0..999 and a score in (0, 1], and the
model was loaded once per worker. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import TypedDict

import udfchain as uc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_cnn  # noqa: E402  (next to this file)


class Label(TypedDict):
    cls: int
    score: float


class Classify(uc.BatchMapper):
    """Top-1 class and score of each image, `batch_size` images per model call."""

    def __init__(self, model_path: str, loads_log: str | None = None):
        # Plain attributes only: under processes=N the instance is pickled to
        # each worker, and setup() builds the session there.
        self.model_path = model_path
        self.loads_log = loads_log

    def setup(self) -> None:
        if self.loads_log:  # one line per load, to check "once per worker"
            with open(self.loads_log, "a") as f:
                f.write(f"{os.getpid()}\n")
        self.session = tiny_cnn.load(self.model_path)

    def process(self, file: list[uc.File]) -> list[Label]:
        import numpy as np
        from PIL import Image

        rows = []
        for f in file:
            with Image.open(f.open()) as im:  # the prefetched copy for a remote file
                rows.append(tiny_cnn.preprocess(im))
        cls, score = tiny_cnn.top1(self.session, np.stack(rows))
        return [{"cls": int(c), "score": float(s)} for c, s in zip(cls, score)]

    def teardown(self) -> None:
        self.session = None


def check(rows: list[tuple[str, Label | None]], expected_files: int | None, loads: int, workers: int) -> list[str]:
    """What is wrong with the output, if anything."""
    problems = []
    if expected_files is not None and len(rows) != expected_files:
        problems.append(f"{len(rows)} rows for {expected_files} files")
    for path, label in rows:
        if label is None or not (0 <= label["cls"] <= 999) or not (0 < label["score"] <= 1):
            problems.append(f"{path}: {label!r} is not a class in 0..999 with a score in (0, 1]")
    if not 1 <= loads <= workers:
        problems.append(f"the model was loaded {loads} times for {workers} worker(s)")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("uri", nargs="?", help="images to classify (default: 64 generated JPEGs)")
    ap.add_argument("--images", type=int, default=64, help="how many JPEGs to generate without a URI")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--processes", type=int, default=0, help="worker processes (0: in this process)")
    ap.add_argument("--concurrency", type=int, default=1, help="calls of the model at once")
    ap.add_argument("--prefetch", default=None, help="files downloaded ahead (default: the engine's)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="classify-") as tmp:
        os.environ.setdefault("UDFCHAIN_ROOT", os.path.join(tmp, "root"))  # datasets of this run
        expected = None
        uri = args.uri
        if uri is None:
            uri = os.path.join(tmp, "images")
            tiny_cnn.write_jpegs(uri, args.images, width=320, height=240)
            expected = args.images
            print(f"wrote {args.images} JPEGs to {uri}")
        model = tiny_cnn.build(os.path.join(tmp, "tiny_cnn.onnx"))
        loads_log = os.path.join(tmp, "model-loads.txt")
        open(loads_log, "w").close()

        chain = uc.read_storage(uri, glob="*.jpg")
        settings = {"processes": args.processes or None, "prefetch": args.prefetch}
        chain = chain.settings(**{k: v for k, v in settings.items() if v is not None})
        saved = (chain
                 .batch_map(label=Classify(model, loads_log), batch_size=args.batch_size,
                            concurrency=args.concurrency)
                 .save("classified"))

        rows = saved.order_by("file.path").collect("file", "label")
        for f, label in rows[:8]:
            print(f"{f.path:<20} class {label['cls']:>3}  score {label['score']:.4f}")
        if len(rows) > 8:
            print(f"... {len(rows)} rows")
        with open(loads_log) as f:
            loads = sum(1 for line in f if line.strip())
        workers = max(args.processes, 1) if args.processes else 1
        problems = check([(f.path, lab) for f, lab in rows], expected, loads, workers)
        print(f"model loads: {loads} (workers: {workers}); distinct classes: "
              f"{len({lab['cls'] for _, lab in rows if lab})}")
        uc.shutdown_workers()
        if problems:
            for p in problems[:20]:
                print(f"FAILED: {p}", file=sys.stderr)
            return 1
        print("ok: every file has a class in 0..999 and a score in (0, 1]")
        return 0


if __name__ == "__main__":
    sys.exit(main())
