"""Workload M for udfchain (benches/python/driver.py): a class BatchMapper
whose `setup()` loads the model once per worker (in-process: once per UDF
per run; `processes=N`: once per worker process) and whose `process` gets
one list of `udfchain.File` per batch of 32 and runs the model once on it."""

from typing import TypedDict

import udfchain as uc

import udfs


class Label(TypedDict):
    cls: int
    score: float


class Classify(uc.BatchMapper):
    def setup(self):
        self.session = udfs.load_model()

    def process(self, file: list[uc.File]) -> list[Label]:
        out = udfs.classify_bytes(self.session, [f.read() for f in file])
        return [{"cls": c, "score": s} for c, s in out]
