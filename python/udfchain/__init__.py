"""udfchain: chains of Python functions over files in object storage.

    import udfchain as uc

    (uc.read_storage("s3://bucket/images/")
       .settings(prefetch=8, cache=False, parallel=4)
       .filter(uc.C("file.size") > 0)
       .map(meta=image_meta)
       .save("images-meta"))

The engine (Rust, on Apache DataFusion) lists, prefetches and caches the
files; Python functions receive `udfchain.File` objects and run on the
engine's UDF pool, holding the GIL only while they run.
"""

from __future__ import annotations

import atexit

from ._pyarrow import pa

from . import _internal
from ._chain import Chain, expr
from ._file import File
from ._internal import DatasetNotFound, SettingError, StorageError, UdfchainError, UdfError
from ._loader import Loader
from ._chain import udf_invoker, udf_parts, processes_of
from ._state import Aggregator, BatchMapper, Generator, Mapper
from ._udf import output_type, schema_ipc
from ._workers import shutdown_workers, worker_pids

__all__ = [
    "Aggregator",
    "BatchMapper",
    "C",
    "Chain",
    "DatasetNotFound",
    "File",
    "Generator",
    "Mapper",
    "Loader",
    "SettingError",
    "StorageError",
    "UdfError",
    "UdfchainError",
    "dataset_info",
    "func",
    "query",
    "read_csv",
    "read_dataset",
    "read_json",
    "read_pandas",
    "read_parquet",
    "read_records",
    "read_storage",
    "read_values",
    "register",
    "run",
    "shutdown_workers",
    "worker_pids",
]

# Before the interpreter finalizes: no engine thread may run Python after it.
atexit.register(_internal.shutdown)

C = _internal.col
"""A column: `C("file.size")`; dots reach into struct fields."""


class func:
    """Aggregates for `group_by`: count(), sum(col), avg(col), min(col), max(col)."""

    @staticmethod
    def count(col=None):
        return _internal.aggregate("count", None if col is None else expr(col))

    @staticmethod
    def sum(col):
        return _internal.aggregate("sum", expr(col))

    @staticmethod
    def avg(col):
        return _internal.aggregate("avg", expr(col))

    @staticmethod
    def min(col):
        return _internal.aggregate("min", expr(col))

    @staticmethod
    def max(col):
        return _internal.aggregate("max", expr(col))

    # Images (docs/images.md): `img` and `file` are a column name or an
    # expression; the other arguments are constants or expressions.
    @staticmethod
    def image_decode(file="file"):
        """The image in a File column (an Image struct: width, height, mode, data)."""
        return _call("image_decode", file)

    @staticmethod
    def image_thumbnail(file="file", max_side=256):
        """RGB, its longer side at most `max_side`; a JPEG is decoded at reduced size in the DCT."""
        return _call("image_thumbnail", file, max_side)

    @staticmethod
    def image_size(file="file"):
        """Width and height read from the header alone."""
        return _call("image_size", file)

    @staticmethod
    def image_resize(img, width, height, filter=None):
        """Resized to width x height: filter "nearest", "bilinear", "bicubic" or "lanczos3"."""
        return _call("image_resize", img, width, height, *_given(filter))

    @staticmethod
    def image_resize_to_fit(img, max_side, filter=None):
        """Scaled so its longer side is at most `max_side`, keeping the aspect ratio."""
        return _call("image_resize_to_fit", img, max_side, *_given(filter))

    @staticmethod
    def image_crop(img, x, y, width, height):
        return _call("image_crop", img, x, y, width, height)

    @staticmethod
    def image_center_crop(img, width, height):
        return _call("image_center_crop", img, width, height)

    @staticmethod
    def image_convert(img, mode):
        """To "RGB", "L" or "RGBA", as Pillow's convert does."""
        return _call("image_convert", img, mode)

    @staticmethod
    def image_to_tensor(img, width, height, mode="RGB"):
        """An Arrow fixed-shape tensor (height, width, channels) of uint8:
        converted to `mode` and resized when the image is another size."""
        return _call("image_to_tensor", img, width, height, mode)

    @staticmethod
    def image_encode(img, format, quality=None):
        """Encoded as "jpeg", "png" or "webp" (binary); quality for JPEG."""
        return _call("image_encode", img, format, *_given(quality))


def _given(*optional) -> list:
    return [o for o in optional if o is not None]


def _call(name: str, first, *args):
    """`name(first, *args)`: `first` a column name or an expression, `args`
    constants (a str is a constant here: a mode, a filter) or expressions."""
    return _internal.function(name, [expr(first), *args])


def _with(chain, settings) -> Chain:
    c = Chain(chain)
    return c.settings(**settings) if settings else c


def read_storage(uri: str, *, recursive: bool = True, glob: str | None = None, **settings) -> Chain:
    """One row per object under `uri` (a path, file://, memory://, s3://, gs://, az://), column `file`."""
    return _with(_internal.read_storage(uri, recursive, glob), settings)


def read_values(**columns) -> Chain:
    """Rows from Python lists, one keyword per column: `read_values(num=[1, 2, 3])`."""
    table = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return Chain(_internal.read_arrow(sink.getvalue().to_pybytes()))


def read_records(to_insert, schema=None, session=None, settings=None, in_memory=False) -> Chain:
    """Rows from dicts (DataChain's `read_records`): `to_insert` a dict or an
    iterable of dicts; `schema={name: type}` (Python types, as UDF outputs
    take them) gives the columns and their types, else they are inferred.
    `session` and `in_memory` are accepted for DataChain's sake (rows are
    always held in memory until the chain runs)."""
    from ._types import arrow_type

    rows = [to_insert] if isinstance(to_insert, dict) else list(to_insert or [])
    if schema is not None:
        s = pa.schema([(n, arrow_type(t, f"read_records column {n!r}")) for n, t in schema.items()])
        table = pa.Table.from_pylist(rows, schema=s)
    elif rows:
        table = pa.Table.from_pylist(rows)
    else:
        raise ValueError("read_records: no records and no schema to make an empty chain from")
    c = _from_table(table)
    return c.settings(**settings) if settings else c


def read_pandas(df, **settings) -> Chain:
    """Rows of a pandas DataFrame (DataChain's `read_pandas`), its columns by name."""
    return _with_chain(_from_table(pa.Table.from_pandas(df, preserve_index=False)), settings)


def _with_chain(c: Chain, settings) -> Chain:
    return c.settings(**settings) if settings else c


def _from_table(table) -> Chain:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return Chain(_internal.read_arrow(sink.getvalue().to_pybytes()))


def read_parquet(uri: str, **settings) -> Chain:
    return _with(_internal.read_parquet(uri), settings)


def read_csv(uri: str, **settings) -> Chain:
    return _with(_internal.read_csv(uri), settings)


def read_json(uri: str, **settings) -> Chain:
    return _with(_internal.read_json(uri), settings)


def read_dataset(name: str, version: int | None = None, **settings) -> Chain:
    """A saved dataset's latest version (or `version`), under the root (settings root= or $UDFCHAIN_ROOT)."""
    return _with(_internal.read_dataset(name, version), settings)


def dataset_info(name: str, version: int | None = None) -> dict:
    """Dataset `name`'s version `version` (default: its latest): a dict with
    `name`, `version`, `versions` (every version kept), `rows`, `bytes`,
    `created` (a UTC `datetime`), `schema` ({column: Arrow type}) and
    `sources`, what the version read: dicts `{"kind": "storage", "uri": ...}`
    and `{"kind": "dataset", "name": ..., "version": ...}` (credentials are
    never recorded). A missing dataset or version raises `DatasetNotFound`."""
    import datetime
    import json

    info = json.loads(_internal.dataset_info(name, version))
    info["created"] = datetime.datetime.fromtimestamp(info["created"], tz=datetime.timezone.utc)
    info["schema"] = dict(line.split(": ", 1) for line in info["schema"])
    return info


def query(sql: str) -> Chain:
    """A chain over a SQL query (table functions read_storage(...), read_dataset(...), registered UDFs)."""
    return Chain(_internal.query(sql))


def run(script: str) -> list:
    """Runs a udfchain script; per statement a pyarrow Table (rows) or a str (message)."""
    return [
        pa.ipc.open_stream(o).read_all() if isinstance(o, bytes) else o
        for o in _internal.run(script)
    ]


def register(name: str, fn, output=None, processes=None, concurrency=None) -> None:
    """Makes `name(column)` call `fn` (a function or a `uc.Mapper` instance)
    per row in `query` and `run`, with prefetch in front; `processes=N` runs
    it in N worker processes (see Chain.settings). A Mapper's `setup` runs
    once per run of a query that uses it, its `teardown` when that run ends."""
    from ._chain import concurrency_of

    fn, life = udf_parts(fn, "map", None)
    t = output_type(fn, output, "map")
    inv = udf_invoker(fn, "map", t, processes_of(processes), life, concurrency_of(concurrency))
    _internal.register(name, schema_ipc(name, t), inv)
