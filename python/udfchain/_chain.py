"""`Chain`: DataChain's verbs over the engine's lazy chain.

Guarantees: every verb returns a new Chain (chains are immutable and cheap);
nothing runs until `collect`, `count`, `show`, `save`, `to_pyarrow`, ... ; a
UDF captures the settings given before it, as in Rust, and `processes` (the
one setting of Python's own, see `_workers`) likewise. Runs release the GIL
and stop at Ctrl-C.
"""

from __future__ import annotations

import logging
import os

from ._pyarrow import pa

from . import _internal
from ._file import files_of, is_file_type
from ._internal import SettingError
from ._state import Life, Setups, _Udf, is_class_udf
from ._udf import invoker, output_type, params_of, schema_ipc, setup_params
from ._workers import remote


def _text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def processes_of(v) -> int | None:
    """`processes=`: a count, True (one per core), or None/False/0 (in-process)."""
    if v is None or v is False or v == 0:
        return None
    if v is True:
        return os.cpu_count() or 1
    if isinstance(v, int) and 1 <= v <= 4096:
        return v
    raise SettingError(f"processes must be a whole number from 1 to 4096, True or False, got {v!r}")


def concurrency_of(v) -> int | None:
    """`concurrency=`: a whole number >= 1, or None (no bound but `parallel`)."""
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return v
    raise ValueError(f"concurrency must be a whole number >= 1, got {v!r}")


def udf_parts(value, kind: str, setups: Setups | None):
    """The function the engine calls for `value` (a function or a class UDF
    instance) and its `Life` (None when it holds no state)."""
    if is_class_udf(value):
        if value.kind != kind:
            verb = {"map": "map", "gen": "gen", "batch_map": "batch_map", "agg": "agg"}[value.kind]
            raise TypeError(
                f"{type(value).__name__} is a {type(value).__mro__[1].__name__}: add it with {verb}(...), not {kind}(...)"
            )
        fn = value.process
        return fn, Life(value, setups, setup_params(fn, setups))
    if isinstance(value, type) and issubclass(value, _Udf):
        raise TypeError(f"{value.__name__} is a class: pass an instance, e.g. {value.__name__}()")
    if not callable(value):
        raise TypeError(f"a UDF is a function or a class UDF instance, got {value!r}")
    needs = setup_params(value, setups)
    return value, (Life(None, setups, needs) if needs else None)


def udf_invoker(fn, kind: str, t: pa.DataType, processes: int | None, life=None, concurrency=None, gpus=None):
    """The invoker the engine calls: in this process, or in `processes`
    workers (`gpus=` implies workers: `concurrency` of them, else one)."""
    if gpus is not None and processes is None:
        processes = concurrency or 1
    if processes is None:
        return invoker(fn, kind, t, life, concurrency)
    return remote(fn, kind, t, processes, life, concurrency, gpus)


def version_of(v) -> str:
    """`version=`: a string or a whole number, as text."""
    if isinstance(v, str) and v:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    raise TypeError(f"version must be a non-empty string or a whole number, got {v!r}")


def setting_pairs(kw: dict) -> list[tuple[str, str]]:
    """`settings(**kw)` as (name, text) pairs for `Settings::set`."""
    pairs = []
    for k, v in kw.items():
        if v is None:
            continue
        if k == "storage":
            pairs.extend((f"storage.{o}", _text(x)) for o, x in v.items())
        else:
            pairs.append((k, _text(v)))
    return pairs


def expr(e):
    """An expression from an Expr, a column name or a literal."""
    if isinstance(e, _internal.Expr):
        return e
    if isinstance(e, str):
        return _internal.col(e)
    return _internal.literal(e)


def _table(ipc: bytes) -> pa.Table:
    return pa.ipc.open_stream(ipc).read_all()


def _column(table: pa.Table, name: str):
    """Column `name`; dots reach into struct fields (`file.path`)."""
    if name in table.column_names:
        return table.column(name)
    first, *rest = name.split(".")
    if first not in table.column_names or not rest:
        raise KeyError(f"no column {name!r}; the columns are {table.column_names}")
    c = table.column(first).combine_chunks()
    for part in rest:
        if not pa.types.is_struct(c.type) or c.type.get_field_index(part) < 0:
            raise KeyError(f"no column {name!r}")
        c = c.field(part)
    return c


def _values(c) -> list:
    return files_of(c, None) if is_file_type(c.type) else c.to_pylist()


def _flatten(name: str, c, names: list, columns: list) -> None:
    if pa.types.is_struct(c.type) and not is_file_type(c.type):
        for i in range(c.type.num_fields):
            _flatten(f"{name}__{c.type.field(i).name}", c.field(i), names, columns)
    elif is_file_type(c.type):
        for i in range(c.type.num_fields):
            names.append(f"{name}__{c.type.field(i).name}")
            columns.append(c.field(i).to_pylist())
    else:
        names.append(name)
        columns.append(c.to_pylist())


def _rows(table: pa.Table, cols: tuple):
    names = list(cols) if cols else table.column_names
    columns = []
    for n in names:
        c = _column(table, n)
        columns.append(files_of(c, None) if is_file_type(c.type) else c.to_pylist())
    if len(cols) == 1:
        return columns[0]
    rows = list(zip(*columns))
    if cols:
        return rows
    return [dict(zip(names, r)) for r in rows]


def _names(v) -> list[str]:
    return [v] if isinstance(v, str) else list(v)


def _names_or_none(v):
    return None if v is None else _names(v)


def _check_diff(on, right_on, compare, right_compare, added, deleted, modified, same) -> None:
    """DataChain's argument checks of `diff`, with its messages."""
    if not any([added, deleted, modified, same]):
        raise ValueError("At least one of added, deleted, modified, same flags must be set")
    if on is None:
        raise ValueError("'on' must be specified")
    if right_on is not None and len(_names(on)) != len(_names(right_on)):
        raise ValueError("'on' and 'right_on' must be have the same length")
    if right_compare is not None and compare is None:
        raise ValueError("'compare' must be defined if 'right_compare' is defined")
    if compare is not None and right_compare is not None and len(_names(compare)) != len(_names(right_compare)):
        raise ValueError("'compare' and 'right_compare' must have the same length")


def _seed(seed):
    """A seed as the engine's u64 (None: a random one)."""
    if seed is None:
        return None
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    return seed & 0xFFFF_FFFF_FFFF_FFFF


class Chain:
    """A lazy chain of steps and UDFs over a source (see `udfchain.read_storage`)."""

    __slots__ = ("_c", "_processes", "_setups")

    def __init__(self, inner, processes: int | None = None, setups: Setups | None = None):
        self._c = inner
        self._processes = processes
        self._setups = setups

    def _next(self, inner) -> Chain:
        return Chain(inner, self._processes, self._setups)

    # settings and relational steps

    def settings(self, **kw) -> Chain:
        """Settings for the UDFs added after this call: prefetch (int or "auto"),
        cache, cache_limit, parallel, workers, batch_size, ordered,
        max_connections, on_error ("fail", "skip", "null"), root, memory_limit,
        memory_file_limit, progress, cluster, checkpoints (True, False or
        "fresh": saves resume from their checkpoint), delta_unsafe,
        storage={option: value}; and
        processes=N (or True: one per core) to run Python UDFs in N worker
        processes (pure-Python CPU work on N cores; parallel defaults to N)."""
        processes = self._processes
        if "processes" in kw:
            processes = processes_of(kw.pop("processes"))
            if processes is not None and "parallel" not in kw:
                kw["parallel"] = processes
        return Chain(self._c.settings(setting_pairs(kw)), processes, self._setups)

    def setup(self, **fns) -> Chain:
        """Values built once per worker, for the UDFs added after this call:
        `setup(model=lambda: load("m.onnx"))`; a UDF parameter named `model`
        receives the value (it is not a column). Each callable runs once per
        process, lazily, on the first run of a UDF that takes it (under
        `processes=`, once in each worker process); an exception fails the
        run, naming the UDF, with the traceback."""
        base = self._setups or Setups()
        return Chain(self._c, self._processes, base.extended(fns))

    def filter(self, *conditions) -> Chain:
        c = self._c
        for cond in conditions:
            c = c.filter(expr(cond))
        return self._next(c)

    def select(self, *cols, **named) -> Chain:
        exprs = [expr(c) for c in cols] + [expr(e).alias(n) for n, e in named.items()]
        return self._next(self._c.select(exprs))

    def mutate(self, **columns) -> Chain:
        c = self._c
        for name, e in columns.items():
            c = c.mutate(name, expr(e))
        return self._next(c)

    def order_by(self, *cols, descending: bool = False) -> Chain:
        exprs = [expr(c) for c in cols]
        if descending:
            exprs = [e.desc() for e in exprs]
        return self._next(self._c.order_by(exprs))

    def limit(self, n: int) -> Chain:
        return self._next(self._c.limit(n))

    def offset(self, n: int) -> Chain:
        return self._next(self._c.offset(n))

    def distinct(self) -> Chain:
        return self._next(self._c.distinct())

    def union(self, other: Chain) -> Chain:
        return self._next(self._c.union(other._c))

    def join(self, right: Chain, on, right_on=None, how: str = "inner") -> Chain:
        on = [on] if isinstance(on, str) else list(on)
        right_on = on if right_on is None else ([right_on] if isinstance(right_on, str) else list(right_on))
        return self._next(self._c.join(right._c, how, on, right_on))

    def group_by(self, partition_by=(), **aggs) -> Chain:
        """`group_by(partition_by="label", n=func.count(), total=func.sum("file.size"))`."""
        keys = [partition_by] if isinstance(partition_by, str) else list(partition_by)
        return self._next(self._c.group_by([expr(k) for k in keys], [expr(a).alias(n) for n, a in aggs.items()]))

    # dataset verbs (DataChain's names and parameters)

    def diff(
        self,
        other: Chain,
        on,
        right_on=None,
        compare=None,
        right_compare=None,
        added: bool = True,
        deleted: bool = True,
        modified: bool = True,
        same: bool = False,
        status_col: str | None = None,
    ) -> Chain:
        """Rows of this chain vs `other` by the key columns `on`: added (`A`,
        only here), deleted (`D`, only in other, with its values), modified
        (`M`, a `compare` value differs or is null on either side), same
        (`S`); `compare` defaults to every other column both have.
        `status_col="diff"` adds the status as a column."""
        _check_diff(on, right_on, compare, right_compare, added, deleted, modified, same)
        return self._next(
            self._c.diff(
                other._c,
                _names(on),
                _names_or_none(right_on),
                _names_or_none(compare),
                _names_or_none(right_compare),
                added,
                deleted,
                modified,
                same,
                status_col,
            )
        )

    def file_diff(
        self,
        other: Chain,
        on: str = "file",
        right_on: str | None = None,
        added: bool = True,
        modified: bool = True,
        deleted: bool = False,
        same: bool = False,
        status_col: str | None = None,
    ) -> Chain:
        """Files of the File column `on` vs `other`'s, matched by source and
        path, modified when their ETag or version (else size and time) differ."""
        _check_diff(on, right_on, None, None, added, deleted, modified, same)
        return self._next(
            self._c.diff(
                other._c,
                [on],
                None if right_on is None else [right_on],
                None,
                None,
                added,
                deleted,
                modified,
                same,
                status_col,
                True,
            )
        )

    def subtract(self, other: Chain, on=None, right_on=None) -> Chain:
        """Rows whose `on` values (all columns when None) are not among
        `other`'s `right_on` (default: `on`) values."""
        if on is None and right_on is not None:
            raise ValueError("subtract: right_on needs on")
        return self._next(self._c.subtract(other._c, _names_or_none(on), _names_or_none(right_on)))

    def merge(self, right_ds: Chain, on, right_on=None, inner: bool = False, full: bool = False, rname: str = "right_") -> Chain:
        """Joins `right_ds` on equal `on` / `right_on` columns (DataChain's
        `merge`): a left join, or inner (`inner=True`) or full outer
        (`full=True`); every column of both, a right column whose name is
        taken renamed `rname` + name."""
        on = _names(on)
        right_on = on if right_on is None else _names(right_on)
        if len(on) != len(right_on):
            raise ValueError("merge: 'on' and 'right_on' must have the same length")
        how = "full" if full else ("inner" if inner else "left")
        return self._next(self._c.merge(right_ds._c, on, right_on, how, rname))

    def explode(self, col: str, model_name: str | None = None, column: str | None = None, schema_sample_size: int = 1) -> Chain:
        """A column `column` (default `<col>_expl`): the JSON objects of the
        text column `col` as a struct, its fields inferred from the first
        `schema_sample_size` rows (DataChain's `explode`; `model_name` is
        accepted and unused: the struct is the model). A row that does not
        parse fails the run naming it."""
        return self._next(self._c.explode(col, column, schema_sample_size))

    def shuffle(self, seed: int | None = None) -> Chain:
        """The rows in an order drawn from `seed` (random when None): the same
        order for the same seed and rows."""
        return self._next(self._c.shuffle(_seed(seed)))

    def sample(self, n: int, seed: int | None = None) -> Chain:
        """`n` rows (all if fewer), the same ones for the same seed and rows."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"sample: n is a whole number >= 0, got {n!r}")
        return self._next(self._c.sample(n, _seed(seed)))

    def chunk(self, index: int, total: int) -> Chain:
        """Part `index` of `total` (0 <= index < total): disjoint parts that
        together hold every row once, by a hash of each row's values."""
        return self._next(self._c.chunk(index, total))

    # UDFs

    def _udf(self, kind, named, params, output, version, partition_by=(), concurrency=None, gpus=None):
        if len(named) != 1:
            raise TypeError(f"{kind}() takes one output=function pair, e.g. {kind}(meta=image_meta)")
        (out_name, value), = named.items()
        fn, life = udf_parts(value, kind, self._setups)
        t = output_type(fn, output, kind)
        if is_class_udf(value):
            name = type(value).__name__
        else:
            name = getattr(fn, "__name__", out_name)
        if name == "<lambda>":
            name = out_name
        setups = self._setups.names() if self._setups else frozenset()
        c = self._c.udf(
            kind,
            name,
            params_of(fn, params, setups),
            schema_ipc(out_name, t),
            udf_invoker(fn, kind, t, self._processes, life, concurrency_of(concurrency), gpus),
            list(partition_by),
        )
        if version is not None:
            c = c.version(version_of(version))
        return self._next(c)

    # `version=` on each UDF: what a save's checkpoint is keyed by besides
    # the plan, the UDF's name, params and output (docs/python.md, "Resuming
    # a save"). Without it, a function edited after a failed save continues
    # from the rows kept, as DataChain's partial checkpoints do.

    # Each UDF verb takes a function or a class UDF instance (`uc.Mapper`,
    # ...: `setup` / `process` / `teardown`), and `concurrency=N` (at most N
    # calls at once in the process, besides `parallel`; under `processes=`
    # the workers bound it too) and `gpus=` (a count or a fraction of a GPU
    # per instance: the UDF runs in its own worker processes, `concurrency`
    # of them or one, each with its own CUDA_VISIBLE_DEVICES).

    def map(self, params=None, output=None, version=None, concurrency=None, gpus=None, **named) -> Chain:
        """Adds a column per row: `map(meta=image_meta)`; `image_meta(file)` reads column `file`.
        `version="2"`: a save does not reuse the checkpoint of another version."""
        return self._udf("map", named, params, output, version, (), concurrency, gpus)

    def gen(self, params=None, output=None, version=None, concurrency=None, gpus=None, **named) -> Chain:
        """Zero or more rows per row: the function yields values (annotate Iterator[T])."""
        return self._udf("gen", named, params, output, version, (), concurrency, gpus)

    def batch_map(
        self, params=None, output=None, batch_size=None, version=None, concurrency=None, gpus=None, **named
    ) -> Chain:
        """A column computed batch_size rows at a time: the function gets one list per param."""
        c = self if batch_size is None else self.settings(batch_size=batch_size)
        return c._udf("batch_map", named, params, output, version, (), concurrency, gpus)

    def agg(
        self, params=None, output=None, partition_by=(), version=None, concurrency=None, gpus=None, **named
    ) -> Chain:
        """One call per group of equal partition_by values, with one list per param; yields values."""
        keys = [partition_by] if isinstance(partition_by, str) else list(partition_by)
        return self._udf("agg", named, params, output, version, keys, concurrency, gpus)

    # runs

    def to_pyarrow(self) -> pa.Table:
        """Runs the chain: its rows as one pyarrow Table."""
        return _table(self._c.collect())

    def to_batches(self):
        """Runs the chain, yielding its rows as pyarrow RecordBatches as the
        engine makes them: a result of any size is read holding a few
        batches. An error of the run is raised (of its kind's class) by the
        iteration that meets it; leaving the loop early stops the run."""
        for ipc in self._c.stream():
            yield pa.ipc.open_stream(ipc).read_next_batch()

    def to_reader(self):
        """Runs the chain as a pyarrow RecordBatchReader that pulls each batch
        from the engine when it is read (see `to_batches`)."""
        stream = self._c.stream()
        schema = pa.ipc.read_schema(pa.py_buffer(stream.schema()))

        def batches():
            for ipc in stream:
                yield pa.ipc.open_stream(ipc).read_next_batch()

        return pa.RecordBatchReader.from_batches(schema, batches())

    def __arrow_c_stream__(self, requested_schema=None):
        """The Arrow PyCapsule stream interface: `pyarrow.table(chain)`,
        `pyarrow.RecordBatchReader.from_stream(chain)`, `polars.from_arrow(chain)`,
        DuckDB read the chain batch by batch as it runs (see `to_reader`).
        `requested_schema` is passed on to pyarrow's export, which casts to it."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def to_pandas(self):
        return self.to_pyarrow().to_pandas()

    def collect(self, *cols):
        """Rows as dicts; `collect("a")` the values of a; `collect("a", "b")` tuples."""
        return _rows(self.to_pyarrow(), cols)

    def to_list(self, *cols) -> list[tuple]:
        """Rows as tuples (DataChain's `to_list`): all columns, or `cols`
        (dots reach into structs: `to_list("file.path", "size")`)."""
        t = self.to_pyarrow()
        names = list(cols) if cols else t.column_names
        columns = [_values(_column(t, n)) for n in names]
        return list(zip(*columns)) if columns else [() for _ in range(t.num_rows)]

    def to_iter(self, *cols):
        """Yields rows as tuples, batch by batch as the chain runs (DataChain's
        `to_iter`): all columns, or `cols`."""
        for batch in self.to_batches():
            t = pa.Table.from_batches([batch])
            names = list(cols) if cols else t.column_names
            yield from zip(*[_values(_column(t, n)) for n in names])

    def to_values(self, col) -> list:
        """The values of one column (DataChain's `to_values("file.path")`)."""
        return _values(_column(self.to_pyarrow(), col))

    def to_records(self) -> list[dict]:
        """Rows as dicts of leaf values, struct fields flattened with `__`
        (`file__path`), as DataChain's `to_records` does."""
        t = self.to_pyarrow()
        names, columns = [], []
        for name in t.column_names:
            _flatten(name, t.column(name).combine_chunks(), names, columns)
        return [dict(zip(names, r)) for r in zip(*columns)] if columns else []

    # chain-level aggregates (DataChain's sum, avg, min, max)

    def _aggregate(self, how: str, col):
        # The Rust chain's aggregate_value (Chain::sum / avg / min / max).
        t = pa.ipc.open_stream(self._c.aggregate_value(_internal.aggregate(how, expr(col)))).read_all()
        values = _values(t.column(0))
        return values[0] if values else None

    def sum(self, col):
        return self._aggregate("sum", col)

    def avg(self, col):
        return self._aggregate("avg", col)

    def min(self, col):
        return self._aggregate("min", col)

    def max(self, col):
        return self._aggregate("max", col)

    def count(self) -> int:
        return self._c.count()

    def show(self, limit: int = 20) -> None:
        print(self._c.to_table_string(limit))

    def _repr_html_(self) -> str:
        """Jupyter's display: the first 20 rows as an HTML table, image files
        as inline thumbnails (see `udfchain._html`)."""
        from ._html import chain_html

        return chain_html(self)

    def explain(self, analyze: bool = False) -> str:
        return self._c.explain(analyze)

    def save(self, name: str) -> Chain:
        """Saves the rows as the next version of dataset `name`; the chain over it."""
        ds, version, _rows_written = self._c.save(name)
        return self._next(_internal.read_dataset(ds, version))

    def to_pytorch(self, **kw):
        """This chain as a training loader (`udfchain.Loader`): a torch
        IterableDataset when torch imports, a plain iterable otherwise."""
        from ._loader import Loader

        return Loader(self, **kw)

    def to_parquet(self, uri: str) -> None:
        self._c.to_parquet(uri)

    def to_storage(
        self,
        output: str,
        signal: str = "file",
        placement: str = "fullpath",
        link_type: str = "copy",
        num_threads: int | None = None,
        anon: bool | None = None,
        client_config: dict | None = None,
    ) -> None:
        """Writes every file of the File column `signal` below `output` (a
        local dir or a store URI), as DataChain's `to_storage`: `placement`
        "fullpath" | "filepath" | "filename" | "etag" | "checksum",
        `link_type` "copy" | "symlink" (local files into a local dir). Files
        appear complete or not at all; two files with one name are an error
        naming both; a rerun skips files already there with their size.
        `num_threads` bounds the files written at once (the chain's
        `parallel`); `anon=True` reads without credentials; `client_config`
        is taken as `settings(storage=...)` options. Returns None (as
        DataChain); the counts go to the `udfchain` logger at INFO."""
        c = self
        if num_threads is not None:
            c = c.settings(parallel=int(num_threads))
        storage = dict(client_config or {})
        if anon:
            storage["skip_signature"] = True
        if storage:
            c = c.settings(storage=storage)
        written, skipped = c._c.to_storage(output, signal, placement, link_type)
        logging.getLogger("udfchain").info(
            "to_storage %s: %d file(s) written, %d skipped (already there)", output, written, skipped
        )

    def __repr__(self):
        return "Chain(...)"
