"""Results streamed batch by batch: `Chain.__arrow_c_stream__` (the Arrow
PyCapsule interface), `to_reader`, `to_batches` and `to_iter` pull each batch
from the engine as it is read, so memory holds a few batches whatever the
result's size; errors surface on the read that meets them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

import udfchain as uc

from conftest import make_files


def test_stream_reads_what_to_pyarrow_reads() -> None:
    c = uc.query("SELECT v, v * 2 AS w, CAST(v AS VARCHAR) AS s FROM generate_series(1, 20000) AS t(v) ORDER BY v")
    reader = pa.RecordBatchReader.from_stream(c)
    streamed = reader.read_all()
    assert streamed.equals(c.to_pyarrow())
    assert streamed.num_rows == 20000 and streamed.column_names == ["v", "w", "s"]
    assert pa.table(c).equals(streamed)
    assert sum(b.num_rows for b in c.to_batches()) == 20000
    assert list(c.to_iter("v"))[:3] == [(1,), (2,), (3,)]
    # An empty result keeps its columns.
    empty = pa.RecordBatchReader.from_stream(c.filter(uc.C("v") < 0)).read_all()
    assert empty.num_rows == 0 and empty.column_names == ["v", "w", "s"]


def test_stream_of_files_and_udfs(tmp_path: Path) -> None:
    data = make_files(tmp_path / "d", 5)

    def size(file: uc.File) -> int:
        return len(file.read())

    c = uc.read_storage(str(tmp_path / "d")).map(n=size).order_by("file.path")
    t = pa.RecordBatchReader.from_stream(c).read_all()
    assert t.column("n").to_pylist() == [len(data[k]) for k in sorted(data)]
    assert t.equals(c.to_pyarrow())


def test_error_mid_stream_is_an_exception_on_read(tmp_path: Path) -> None:
    make_files(tmp_path / "d", 30, size=10)

    def fails_late(file: uc.File) -> int:
        if file.name == "f025.bin":
            raise ValueError("f025 is bad")
        return file.size

    c = uc.read_storage(str(tmp_path / "d")).order_by("file.path").settings(batch_size=8).map(n=fails_late)
    # Through the C stream interface: pyarrow's error, carrying the engine's message.
    with pytest.raises(Exception, match="f025 is bad"):
        pa.RecordBatchReader.from_stream(c).read_all()
    # Through the package's own iteration: the kind's class.
    with pytest.raises(uc.UdfError, match="f025 is bad"):
        for _ in c.to_batches():
            pass
    with pytest.raises(uc.UdfError, match="f025 is bad"):
        c.to_reader().read_all()
    # The process is fine afterwards.
    assert uc.read_storage(str(tmp_path / "d")).count() == 30


# A generated result of ~1.5 GB (1.5 M rows of 1000 bytes), read batch by batch.
_BIG = """
import json, resource, sys, time
import pyarrow as pa
import udfchain as uc

rows, width = {rows}, {width}
# Each row's text differs (a constant would be one shared value, not data).
c = uc.query(f"SELECT v, lpad(CAST(v AS VARCHAR), {{width}}, 'x') AS s FROM generate_series(1, {{rows}}) AS t(v)")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.monotonic()
reader = pa.RecordBatchReader.from_stream(c)
n = nbytes = batches = biggest = 0
for batch in reader:
    n += batch.num_rows
    nbytes += batch.nbytes
    batches += 1
    biggest = max(biggest, batch.nbytes)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"rows": n, "bytes": nbytes, "batches": batches, "biggest": biggest,
                  "before": before, "peak": peak, "seconds": time.monotonic() - start}}))
"""


def test_large_result_is_read_with_bounded_memory() -> None:
    rows, width = 1_500_000, 1000
    code = _BIG.format(rows=rows, width=width)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout.strip().splitlines()[-1])
    print(m)
    assert m["rows"] == rows and m["bytes"] >= rows * width
    # The result is ~1.5 GB; the reader's process grows by a few batches
    # (each ~8 MB here; about 100 MB in all when measured), nowhere near the
    # result (`to_pyarrow()` of it peaks at ~4.5 GB).
    grown = m["peak"] - m["before"]
    assert grown < 400 * 2**20, m
    assert grown < m["bytes"] / 4, m


def test_abandoned_reader_does_not_hang_exit(tmp_path: Path) -> None:
    make_files(tmp_path / "d", 200, size=10)
    code = textwrap.dedent(
        f"""
        import pyarrow as pa
        import udfchain as uc

        def slow(file: uc.File) -> int:
            import time
            time.sleep(0.01)
            return file.size

        c = uc.read_storage({str(tmp_path / "d")!r}).settings(batch_size=4, prefetch=4).map(n=slow)
        reader = pa.RecordBatchReader.from_stream(c)
        first = reader.read_next_batch()
        assert first.num_rows > 0
        kept = (reader, iter(c.to_batches()))
        next(kept[1])
        print("read one batch")
        """
    )
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "read one batch" in out.stdout
    assert time.monotonic() - start < 60
