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
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import _chain, _internal, _udf, cluster, functions
from ._chain import Chain
from ._file import File
from ._internal import (
    DatasetNotFound,
    Expr,
    SettingError,
    StorageError,
    UdfchainError,
    UdfError,
)
from ._loader import Loader
from ._pyarrow import pa as _pa
from ._settings import Settings
from ._state import Aggregator, BatchMapper, Generator, Mapper
from ._workers import shutdown_workers, worker_pids

if TYPE_CHECKING:
    import pandas
    import pyarrow
    from typing_extensions import Unpack

__all__ = [
    "Aggregator",
    "BatchMapper",
    "C",
    "Chain",
    "DatasetNotFound",
    "Expr",
    "File",
    "Generator",
    "Loader",
    "Mapper",
    "SettingError",
    "Settings",
    "StorageError",
    "UdfError",
    "UdfchainError",
    "cluster",
    "connect",
    "dataset_info",
    "func",
    "functions",
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

__version__ = _internal.version()

# Before the interpreter finalizes: no engine thread may run Python after it.
atexit.register(_internal.shutdown)

func = functions
"""`udfchain.functions` under its older name: `uc.func.count()`."""


def C(name: str) -> Expr:
    """A column: `C("file.size")`; dots reach into struct fields. Compare
    and combine columns with Python's operators: `(C("size") > 0) & (C("label") == "cat")`."""
    return _internal.col(name)


def _source(inner: _internal.Chain, step: str, settings: Settings) -> Chain:
    c = Chain(inner, steps=(step,))
    return c.settings(**settings) if settings else c


def connect(url: str | None, **settings: Unpack[Settings]) -> None:
    """Runs every chain of this process on the cluster whose scheduler is at
    `url` (`df://HOST:PORT`), with `settings` (e.g. `workers=4`) as the
    defaults each chain starts from (its own settings override them, and
    `settings(cluster="local")` runs one chain here). Checks now that the
    scheduler answers (a `UdfchainError` naming it otherwise); `None` goes
    back to local runs. Python UDFs run on Python executors
    (`python -m udfchain cluster executor`, see `udfchain.cluster`)."""
    if url is None:
        _internal.connect([])
        return
    _internal.connect(_chain.setting_pairs({**settings, "cluster": url}))


def _args(*args: object, **kw: object) -> str:
    """Arguments as a call shows them (for `Chain.__repr__`)."""
    return ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kw.items() if v is not None])


def read_storage(
    uri: str, *, recursive: bool = True, glob: str | None = None, **settings: Unpack[Settings]
) -> Chain:
    """One row per object under `uri` (a path, file://, memory://, s3://,
    gs://, az://), in column `file` (a `File`); `recursive=False` lists one
    level, `glob="*.jpg"` keeps matching paths. Keyword settings as
    `Chain.settings` takes them."""
    step = f"read_storage({_args(uri, recursive=None if recursive else False, glob=glob)})"
    return _source(_internal.read_storage(uri, recursive, glob), step, settings)


def read_values(**columns: Iterable[Any]) -> Chain:
    """Rows from Python lists (or numpy arrays), one keyword per column:
    `read_values(num=[1, 2, 3])`."""
    table = _pa.table(columns)
    return _from_table(table, f"read_values({', '.join(columns)})")


def read_records(
    to_insert: Mapping[str, Any] | Iterable[Mapping[str, Any]] | None,
    schema: Mapping[str, Any] | None = None,
    session: object = None,
    settings: Settings | None = None,
    in_memory: bool = False,
) -> Chain:
    """Rows from dicts (DataChain's `read_records`): `to_insert` a dict or an
    iterable of dicts; `schema={name: type}` (Python types, as UDF outputs
    take them) gives the columns and their types, else they are inferred.
    `session` and `in_memory` are accepted for DataChain's sake (rows are
    always held in memory until the chain runs)."""
    from ._types import arrow_type

    rows = [to_insert] if isinstance(to_insert, Mapping) else list(to_insert or [])
    if schema is not None:
        s = _pa.schema([(n, arrow_type(t, f"read_records column {n!r}")) for n, t in schema.items()])
        table = _pa.Table.from_pylist(rows, schema=s)
    elif rows:
        table = _pa.Table.from_pylist(rows)
    else:
        raise ValueError("read_records: no records and no schema to make an empty chain from")
    c = _from_table(table, f"read_records({len(rows)} rows)")
    return c.settings(**settings) if settings else c


def read_pandas(df: pandas.DataFrame, **settings: Unpack[Settings]) -> Chain:
    """Rows of a pandas DataFrame (DataChain's `read_pandas`), its columns by name."""
    c = _from_table(_pa.Table.from_pandas(df, preserve_index=False), f"read_pandas({len(df)} rows)")
    return c.settings(**settings) if settings else c


def _from_table(table: pyarrow.Table, step: str) -> Chain:
    sink = _pa.BufferOutputStream()
    with _pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return Chain(_internal.read_arrow(sink.getvalue().to_pybytes()), steps=(step,))


def read_parquet(uri: str, **settings: Unpack[Settings]) -> Chain:
    """The rows of the Parquet file(s) at `uri` (a file, a directory or a store URI)."""
    return _source(_internal.read_parquet(uri), f"read_parquet({uri!r})", settings)


def read_csv(uri: str, **settings: Unpack[Settings]) -> Chain:
    """The rows of the CSV file(s) at `uri` (a header row names the columns)."""
    return _source(_internal.read_csv(uri), f"read_csv({uri!r})", settings)


def read_json(uri: str, **settings: Unpack[Settings]) -> Chain:
    """The rows of the newline-delimited JSON file(s) at `uri`."""
    return _source(_internal.read_json(uri), f"read_json({uri!r})", settings)


def read_dataset(name: str, version: int | None = None, **settings: Unpack[Settings]) -> Chain:
    """A saved dataset's latest version (or `version`), under the root
    (settings root= or $UDFCHAIN_ROOT). A missing one raises
    `DatasetNotFound` when the chain runs."""
    step = f"read_dataset({_args(name, version=version)})"
    return _source(_internal.read_dataset(name, version), step, settings)


def dataset_info(name: str, version: int | None = None) -> dict[str, Any]:
    """Dataset `name`'s version `version` (default: its latest): a dict with
    `name`, `version`, `versions` (every version kept), `rows`, `bytes`,
    `created` (a UTC `datetime`), `schema` ({column: Arrow type}) and
    `sources`, what the version read: dicts `{"kind": "storage", "uri": ...}`
    and `{"kind": "dataset", "name": ..., "version": ...}` (credentials are
    never recorded). A missing dataset or version raises `DatasetNotFound`."""
    import datetime
    import json

    info: dict[str, Any] = json.loads(_internal.dataset_info(name, version))
    info["created"] = datetime.datetime.fromtimestamp(info["created"], tz=datetime.timezone.utc)
    info["schema"] = dict(line.split(": ", 1) for line in info["schema"])
    return info


def query(sql: str) -> Chain:
    """A chain over a SQL query (DataFusion's dialect; table functions
    read_storage(...), read_dataset(...); the UDFs given to `register`)."""
    return Chain(_internal.query(sql), steps=(f"query({sql!r})",))


def run(script: str) -> list[pyarrow.Table | str]:
    """Runs a udfchain script (statements separated by `;`): per statement a
    pyarrow Table (its rows) or a str (its message)."""
    return [
        _pa.ipc.open_stream(o).read_all() if isinstance(o, bytes) else o
        for o in _internal.run(script)
    ]


def register(
    name: str,
    fn: Callable[..., Any] | Mapper,
    output: Any = None,
    processes: int | bool | None = None,
    concurrency: int | None = None,
) -> None:
    """Makes `name(column)` call `fn` (a function or a `uc.Mapper` instance)
    per row in `query` and `run`, with prefetch in front. `output`: the
    values' type (a Python type or a pyarrow type; default: the return
    annotation); `processes=N` runs it in N worker processes (see
    `Chain.settings`); `concurrency=N` bounds its calls at once. A Mapper's
    `setup` runs once per run of a query that uses it, its `teardown` when
    that run ends."""
    f, life = _chain.udf_parts(fn, "map", None)
    t = _udf.output_type(f, output, "map")
    inv = _chain.udf_invoker(
        f, "map", t, _chain.processes_of(processes), life, _chain.concurrency_of(concurrency)
    )
    _internal.register(name, _udf.schema_ipc(name, t), inv)
