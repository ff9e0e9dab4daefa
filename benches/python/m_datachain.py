"""Workload M for DataChain 0.62 (benches/python/driver.py): a `Mapper`
whose `setup()` loads the model once per worker process, the way
DataChain's docs load a model. DataChain 0.62 has no batched mapper (its
only batched-input UDF is `agg`, one call per group), so `process` runs the
model on one image per call (a batch of 1)."""

import datachain as dc

import udfs


class Classify(dc.Mapper):
    def setup(self):
        self.session = udfs.load_model()

    def process(self, file: dc.File) -> tuple[int, float]:
        return udfs.classify_bytes(self.session, [file.read()])[0]
