"""A smoke test of an installed `udfchain` (a wheel, no Rust toolchain):
a small chain end to end — files listed and prefetched, a Python UDF, a
filter, a save and a read back, SQL with a registered function, the Arrow
stream — checked against what plain Python computes.

Run by python/wheel-smoke.sh and the release workflow, from a directory
outside the repository so that `import udfchain` finds the installed one.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

import udfchain as uc


def sha(file: uc.File) -> str:
    return hashlib.sha256(file.read()).hexdigest()


def main() -> None:
    here = Path(uc.__file__).resolve().parent
    print(f"udfchain from {here}")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        want = {}
        for i in range(20):
            body = os.urandom(1000 + i)
            (data / f"f{i:02}.bin").write_bytes(body)
            want[f"f{i:02}.bin"] = hashlib.sha256(body).hexdigest()
        os.environ["UDFCHAIN_ROOT"] = str(Path(tmp) / "root")

        chain = (
            uc.read_storage(str(data))
            .settings(prefetch=4, parallel=2)
            .filter(uc.C("file.size") > 1004)
            .map(digest=sha)
        )
        saved = chain.save("smoke")
        got = dict(saved.order_by("file.path").to_list("file.path", "digest"))
        assert got == {k: v for k, v in want.items() if int(k[1:3]) >= 5}, got
        assert uc.dataset_info("smoke")["rows"] == 15

        uc.register("py_sha", sha)
        q = uc.query(f"SELECT file.path AS path, py_sha(file) AS d FROM read_storage('{data}') ORDER BY path")
        assert q.collect("path", "d") == sorted(want.items())

        streamed = pa.RecordBatchReader.from_stream(uc.read_dataset("smoke")).read_all()
        assert streamed.num_rows == 15 and "digest" in streamed.column_names
        try:
            uc.read_dataset("nope").count()
        except uc.DatasetNotFound as e:
            assert "nope" in str(e)
        else:
            raise AssertionError("a missing dataset did not raise DatasetNotFound")
    print(f"smoke test passed (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
