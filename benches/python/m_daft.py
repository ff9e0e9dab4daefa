"""Workload M for Daft 0.7 (benches/python/driver.py): a class whose
`__init__` loads the model once per instance and whose batch method gets a
`daft.Series` of JPEG bytes (`download()` of the paths) and runs the model
once per batch of 32. Left undecorated here: the driver wraps it with
`daft.cls(Classify, **settings)` (e.g. `max_concurrency=`, `use_process=`),
the `@daft.cls(...)` of a script."""

import daft
from daft import DataType

import udfs

LABEL = DataType.struct({"cls": DataType.int64(), "score": DataType.float64()})


class Classify:
    def __init__(self):
        self.session = udfs.load_model()

    @daft.method.batch(return_dtype=LABEL, batch_size=32)
    def classify(self, data: daft.Series) -> daft.Series:
        out = udfs.classify_bytes(self.session, data.to_pylist())
        return daft.Series.from_pylist([{"cls": c, "score": s} for c, s in out], dtype=LABEL)
