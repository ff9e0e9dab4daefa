"""`Chain`: DataChain's verbs over the engine's lazy chain.

Guarantees: every verb returns a new Chain (chains are immutable and cheap);
nothing runs until `collect`, `count`, `show`, `save`, `to_pyarrow`, ... ; a
UDF captures the settings given before it, as in Rust, and `processes` (the
one setting of Python's own, see `_workers`) likewise. Runs release the GIL
and stop at Ctrl-C.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Union

from . import _internal
from ._file import files_of, is_file_type
from ._internal import Expr, SettingError
from ._pyarrow import pa
from ._ship import ship
from ._state import Life, Setups, _Udf, is_class_udf
from ._udf import Invoker, invoker, output_type, params_of, schema_ipc, setup_params
from ._workers import Remote, remote
from .functions import Value
from .functions import _expr as expr

if TYPE_CHECKING:
    import pandas
    import pyarrow
    from typing_extensions import Unpack

    from ._loader import Loader
    from ._settings import Settings

Names = Union[str, Sequence[str]]
"""One column name, or several."""

Udf = Union[Callable[..., Any], _Udf]
"""A UDF: a function, or an instance of a class UDF (`uc.Mapper`, ...)."""


def _text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def processes_of(v: object) -> int | None:
    """`processes=`: a count, True (one per core), or None/False/0 (in-process)."""
    if v is None or v is False or v == 0:
        return None
    if v is True:
        return os.cpu_count() or 1
    if isinstance(v, int) and 1 <= v <= 4096:
        return v
    raise SettingError(f"processes must be a whole number from 1 to 4096, True or False, got {v!r}")


def concurrency_of(v: object) -> int | None:
    """`concurrency=`: a whole number >= 1, or None (no bound but `parallel`)."""
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return v
    raise ValueError(f"concurrency must be a whole number >= 1, got {v!r}")


def udf_parts(value: Udf, kind: str, setups: Setups | None) -> tuple[Callable[..., Any], Life | None]:
    """The function the engine calls for `value` (a function or a class UDF
    instance) and its `Life` (None when it holds no state)."""
    if is_class_udf(value):
        if value.kind != kind:
            verb = {"map": "map", "gen": "gen", "batch_map": "batch_map", "agg": "agg"}[value.kind]
            raise TypeError(
                f"{type(value).__name__} is a {type(value).__mro__[1].__name__}: add it with {verb}(...), not {kind}(...)"
            )
        fn: Callable[..., Any] = value.process
        return fn, Life(value, setups, setup_params(fn, setups))
    if isinstance(value, type) and issubclass(value, _Udf):
        raise TypeError(f"{value.__name__} is a class: pass an instance, e.g. {value.__name__}()")
    if not callable(value):
        raise TypeError(f"a UDF is a function or a class UDF instance, got {value!r}")
    needs = setup_params(value, setups)
    return value, (Life(None, setups, needs) if needs else None)


def udf_invoker(
    fn: Callable[..., Any],
    kind: str,
    t: pyarrow.DataType,
    processes: int | None,
    life: Life | None = None,
    concurrency: int | None = None,
    gpus: float | None = None,
) -> Invoker | Remote:
    """The invoker the engine calls: in this process, or in `processes`
    workers (`gpus=` implies workers: `concurrency` of them, else one)."""
    if gpus is not None and processes is None:
        processes = concurrency or 1
    if processes is None:
        return invoker(fn, kind, t, life, concurrency)
    return remote(fn, kind, t, processes, life, concurrency, gpus)


def version_of(v: object) -> str:
    """`version=`: a string or a whole number, as text."""
    if isinstance(v, str) and v:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    raise TypeError(f"version must be a non-empty string or a whole number, got {v!r}")


def setting_pairs(kw: Settings) -> list[tuple[str, str]]:
    """`settings(**kw)` as (name, text) pairs for `Settings::set`."""
    pairs: list[tuple[str, str]] = []
    for k, v in kw.items():
        if v is None:
            continue
        if k == "storage":
            pairs.extend((f"storage.{o}", _text(x)) for o, x in dict(v).items())  # type: ignore[call-overload]
        else:
            pairs.append((k, _text(v)))
    return pairs


def _table(ipc: bytes) -> pyarrow.Table:
    return pa.ipc.open_stream(ipc).read_all()


def _column(table: pyarrow.Table, name: str) -> Any:
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


def _values(c: Any) -> list[Any]:
    return files_of(c, None) if is_file_type(c.type) else c.to_pylist()


def _flatten(name: str, c: Any, names: list[str], columns: list[list[Any]]) -> None:
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


def _rows(table: pyarrow.Table, cols: tuple[str, ...]) -> list[Any]:
    names = list(cols) if cols else table.column_names
    columns: list[list[Any]] = []
    for n in names:
        c = _column(table, n)
        columns.append(files_of(c, None) if is_file_type(c.type) else c.to_pylist())
    if len(cols) == 1:
        return columns[0]
    rows = list(zip(*columns))
    if cols:
        return rows
    return [dict(zip(names, r)) for r in rows]


def _names(v: Names) -> list[str]:
    return [v] if isinstance(v, str) else list(v)


def _names_or_none(v: Names | None) -> list[str] | None:
    return None if v is None else _names(v)


def _check_diff(
    on: Names | None,
    right_on: Names | None,
    compare: Names | None,
    right_compare: Names | None,
    added: bool,
    deleted: bool,
    modified: bool,
    same: bool,
) -> None:
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


def _seed(seed: int | None) -> int | None:
    """A seed as the engine's u64 (None: a random one)."""
    if seed is None:
        return None
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    return seed & 0xFFFF_FFFF_FFFF_FFFF


def _arg(v: object) -> str:
    """A value as `Chain.__repr__` shows it: a function by its name."""
    if isinstance(v, _Udf):
        return f"{type(v).__name__}()"
    name = getattr(v, "__name__", None)
    if callable(v) and isinstance(name, str):
        return name
    return repr(v)


def _call_text(verb: str, *args: object, **kw: object) -> str:
    parts = [_arg(a) for a in args] + [f"{k}={_arg(v)}" for k, v in kw.items() if v is not None]
    return f"{verb}({', '.join(parts)})"


class Chain:
    """A lazy chain of steps and UDFs over a source (see `udfchain.read_storage`).

    Every verb returns a new Chain; nothing runs until a run (`collect`,
    `count`, `show`, `save`, `to_pyarrow`, iteration through
    `__arrow_c_stream__`, ...). `repr(chain)` shows its steps."""

    __slots__ = ("_c", "_processes", "_setups", "_steps")

    def __init__(
        self,
        inner: _internal.Chain,
        processes: int | None = None,
        setups: Setups | None = None,
        steps: tuple[str, ...] = (),
    ):
        self._c = inner
        self._processes = processes
        self._setups = setups
        self._steps = steps

    def _next(self, inner: _internal.Chain, step: str) -> Chain:
        return Chain(inner, self._processes, self._setups, self._steps + (step,))

    def __repr__(self) -> str:
        """The chain as the calls that made it, one step per line."""
        if not self._steps:
            return "Chain(...)"
        first, *rest = self._steps
        return "\n".join([f"Chain({first}", *(f"  .{step}" for step in rest)]) + ")"

    # settings and relational steps

    def settings(self, **kw: Unpack[Settings]) -> Chain:
        """Settings for the UDFs added after this call (a setting not given
        keeps its earlier value; `None` too). Names, types and defaults:

        - prefetch: int or "auto" (default "auto"): files downloading ahead of each UDF
        - cache: bool (False): keep downloaded files in the shared cache
        - cache_limit: int bytes or a size like "10g" (no limit)
        - parallel: int (the number of cores): UDF calls at once
        - workers: int (1): partitions per UDF on a cluster
        - batch_size: int (1000): rows per batch_map call
        - ordered: bool (True): keep input order through UDFs
        - max_connections: int (128): downloads in flight per operator
        - on_error: "fail", "skip" or "null" ("fail")
        - root: a directory ($UDFCHAIN_ROOT, else ./.udfchain)
        - memory_limit, memory_file_limit, temp_dir_limit: sizes (none, "1m",
          half the space free under the root's tmp when a run starts)
        - progress: bool (False)
        - cluster: "df://HOST:PORT" (local); cluster_executor_timeout: "60s"
        - checkpoints: True, False or "fresh" (True): saves resume from their checkpoint
        - delta_unsafe: bool (False)
        - storage: {option: value} (from the environment): store options
        - processes: N, or True for one per core (None: in-process): run
          Python UDFs in N worker processes (pure-Python CPU work on N
          cores; parallel defaults to N)

        A value that is not accepted raises `SettingError` (an unknown name
        suggests the closest one). See docs/settings.md."""
        processes = self._processes
        given = {k: v for k, v in kw.items() if v is not None}
        if "processes" in kw:
            processes = processes_of(kw.pop("processes"))
            if processes is not None and "parallel" not in kw:
                kw["parallel"] = processes
        step = _call_text("settings", **given)
        return Chain(self._c.settings(setting_pairs(kw)), processes, self._setups, self._steps + (step,))

    def setup(self, **fns: Callable[[], Any]) -> Chain:
        """Values built once per worker, for the UDFs added after this call:
        `setup(model=lambda: load("m.onnx"))`; a UDF parameter named `model`
        receives the value (it is not a column). Each callable runs once per
        process, lazily, on the first run of a UDF that takes it (under
        `processes=`, once in each worker process); an exception fails the
        run, naming the UDF, with the traceback."""
        base = self._setups or Setups()
        step = _call_text("setup", **fns)
        return Chain(self._c, self._processes, base.extended(fns), self._steps + (step,))

    def filter(self, *conditions: Expr) -> Chain:
        """The rows for which every condition holds: `filter(uc.C("file.size") > 0)`."""
        c = self._c
        for cond in conditions:
            c = c.filter(expr(cond))
        return self._next(c, _call_text("filter", *conditions))

    def select(self, *cols: Value, **named: Value) -> Chain:
        """Only these columns (names or expressions), and `name=expression` ones."""
        exprs = [expr(c) for c in cols] + [expr(e).alias(n) for n, e in named.items()]
        return self._next(self._c.select(exprs), _call_text("select", *cols, **named))

    def mutate(self, **columns: Value) -> Chain:
        """Adds (or replaces) columns: `mutate(kb=uc.C("file.size") / 1024)`."""
        c = self._c
        for name, e in columns.items():
            c = c.mutate(name, expr(e))
        return self._next(c, _call_text("mutate", **columns))

    def order_by(self, *cols: Value, descending: bool = False) -> Chain:
        """Rows sorted by `cols` (names or expressions), ascending unless `descending`."""
        exprs = [expr(c) for c in cols]
        if descending:
            exprs = [e.desc() for e in exprs]
        step = _call_text("order_by", *cols, descending=True if descending else None)
        return self._next(self._c.order_by(exprs), step)

    def limit(self, n: int) -> Chain:
        """At most `n` rows."""
        return self._next(self._c.limit(n), f"limit({n})")

    def offset(self, n: int) -> Chain:
        """The rows after the first `n`."""
        return self._next(self._c.offset(n), f"offset({n})")

    def distinct(self) -> Chain:
        """Each distinct row once."""
        return self._next(self._c.distinct(), "distinct()")

    def union(self, other: Chain) -> Chain:
        """The rows of both chains (of the same columns)."""
        return self._next(self._c.union(other._c), "union(...)")

    def join(
        self,
        right: Chain,
        on: Names,
        right_on: Names | None = None,
        how: Literal["inner", "left", "right", "full", "outer", "semi", "anti"] = "inner",
    ) -> Chain:
        """Joins `right` where the `on` columns equal its `right_on` columns
        (default: `on`); `how` "inner", "left", "right", "full", "semi" or "anti"."""
        on_ = _names(on)
        right_on_ = on_ if right_on is None else _names(right_on)
        step = _call_text("join", "...", on, right_on=right_on, how=None if how == "inner" else how)
        return self._next(self._c.join(right._c, how, on_, right_on_), step)

    def group_by(self, partition_by: Names = (), **aggs: Expr) -> Chain:
        """One row per group of equal `partition_by` values, with aggregates
        from `udfchain.functions`:
        `group_by(partition_by="label", n=func.count(), total=func.sum("file.size"))`."""
        keys = _names(partition_by)
        step = _call_text("group_by", partition_by=partition_by or None, **aggs)
        return self._next(self._c.group_by([expr(k) for k in keys], [expr(a).alias(n) for n, a in aggs.items()]), step)

    # dataset verbs (DataChain's names and parameters)

    def diff(
        self,
        other: Chain,
        on: Names,
        right_on: Names | None = None,
        compare: Names | None = None,
        right_compare: Names | None = None,
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
            ),
            _call_text("diff", "...", on, compare=compare, status_col=status_col),
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
            ),
            _call_text("file_diff", "...", on, status_col=status_col),
        )

    def subtract(self, other: Chain, on: Names | None = None, right_on: Names | None = None) -> Chain:
        """Rows whose `on` values (all columns when None) are not among
        `other`'s `right_on` (default: `on`) values."""
        if on is None and right_on is not None:
            raise ValueError("subtract: right_on needs on")
        return self._next(
            self._c.subtract(other._c, _names_or_none(on), _names_or_none(right_on)),
            _call_text("subtract", "...", on=on, right_on=right_on),
        )

    def merge(
        self,
        right_ds: Chain,
        on: Names,
        right_on: Names | None = None,
        inner: bool = False,
        full: bool = False,
        rname: str = "right_",
    ) -> Chain:
        """Joins `right_ds` on equal `on` / `right_on` columns (DataChain's
        `merge`): a left join, or inner (`inner=True`) or full outer
        (`full=True`); every column of both, a right column whose name is
        taken renamed `rname` + name."""
        on_ = _names(on)
        right_on_ = on_ if right_on is None else _names(right_on)
        if len(on_) != len(right_on_):
            raise ValueError("merge: 'on' and 'right_on' must have the same length")
        how = "full" if full else ("inner" if inner else "left")
        step = _call_text("merge", "...", on, right_on=right_on, inner=inner or None, full=full or None)
        return self._next(self._c.merge(right_ds._c, on_, right_on_, how, rname), step)

    def explode(
        self, col: str, model_name: str | None = None, column: str | None = None, schema_sample_size: int = 1
    ) -> Chain:
        """A column `column` (default `<col>_expl`): the JSON objects of the
        text column `col` as a struct, its fields inferred from the first
        `schema_sample_size` rows (DataChain's `explode`; `model_name` is
        accepted and unused: the struct is the model). A row that does not
        parse fails the run naming it."""
        return self._next(self._c.explode(col, column, schema_sample_size), _call_text("explode", col, column=column))

    def shuffle(self, seed: int | None = None) -> Chain:
        """The rows in an order drawn from `seed` (random when None): the same
        order for the same seed and rows."""
        return self._next(self._c.shuffle(_seed(seed)), _call_text("shuffle", seed=seed))

    def sample(self, n: int, seed: int | None = None) -> Chain:
        """`n` rows (all if fewer), the same ones for the same seed and rows."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"sample: n is a whole number >= 0, got {n!r}")
        return self._next(self._c.sample(n, _seed(seed)), _call_text("sample", n, seed=seed))

    def chunk(self, index: int, total: int) -> Chain:
        """Part `index` of `total` (0 <= index < total): disjoint parts that
        together hold every row once, by a hash of each row's values."""
        return self._next(self._c.chunk(index, total), f"chunk({index}, {total})")

    # UDFs

    def _udf(
        self,
        kind: str,
        named: dict[str, Udf],
        params: Names | None,
        output: Any,
        version: str | int | None,
        partition_by: Sequence[str] = (),
        concurrency: int | None = None,
        gpus: float | None = None,
    ) -> Chain:
        if len(named) != 1:
            raise TypeError(f"{kind}() takes one output=function pair, e.g. {kind}(meta=image_meta)")
        ((out_name, value),) = named.items()
        fn, life = udf_parts(value, kind, self._setups)
        t = output_type(fn, output, kind)
        if is_class_udf(value):
            name = type(value).__name__
        else:
            name = getattr(fn, "__name__", out_name)
        if name == "<lambda>":
            name = out_name
        setups = self._setups.names() if self._setups else frozenset()
        bound = concurrency_of(concurrency)
        c = self._c.udf(
            kind,
            name,
            params_of(fn, params, setups),
            schema_ipc(out_name, t),
            udf_invoker(fn, kind, t, self._processes, life, bound, gpus),
            list(partition_by),
            # Asked only when the chain runs on a cluster (see `_ship`).
            functools.partial(ship, fn, kind, t, self._processes, life, bound, gpus),
        )
        if version is not None:
            c = c.version(version_of(version))
        step = _call_text(
            kind,
            **named,
            params=params,
            partition_by=list(partition_by) or None,
            version=version,
            concurrency=concurrency,
            gpus=gpus,
        )
        return self._next(c, step)

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

    def map(
        self,
        params: Names | None = None,
        output: Any = None,
        version: str | int | None = None,
        concurrency: int | None = None,
        gpus: float | None = None,
        **named: Udf,
    ) -> Chain:
        """Adds a column per row: `map(meta=image_meta)`; `image_meta(file)`
        reads column `file` (`params=` names other columns). `output=`: the
        values' type (a Python or pyarrow type; default: the return
        annotation). `version="2"`: a save does not reuse the checkpoint of
        another version. `concurrency=N`: at most N calls at once; `gpus=`:
        GPUs per instance (its own worker processes)."""
        return self._udf("map", named, params, output, version, (), concurrency, gpus)

    def gen(
        self,
        params: Names | None = None,
        output: Any = None,
        version: str | int | None = None,
        concurrency: int | None = None,
        gpus: float | None = None,
        **named: Udf,
    ) -> Chain:
        """Zero or more rows per row: the function yields values (annotate
        Iterator[T]); other arguments as `map`'s."""
        return self._udf("gen", named, params, output, version, (), concurrency, gpus)

    def batch_map(
        self,
        params: Names | None = None,
        output: Any = None,
        batch_size: int | None = None,
        version: str | int | None = None,
        concurrency: int | None = None,
        gpus: float | None = None,
        **named: Udf,
    ) -> Chain:
        """A column computed `batch_size` rows at a time: the function gets
        one list per param and returns one value per row; other arguments as
        `map`'s."""
        c = self if batch_size is None else self.settings(batch_size=batch_size)
        return c._udf("batch_map", named, params, output, version, (), concurrency, gpus)

    def agg(
        self,
        params: Names | None = None,
        output: Any = None,
        partition_by: Names = (),
        version: str | int | None = None,
        concurrency: int | None = None,
        gpus: float | None = None,
        **named: Udf,
    ) -> Chain:
        """One call per group of equal `partition_by` values, with one list
        per param; yields values (rows of the group's output)."""
        return self._udf("agg", named, params, output, version, _names(partition_by), concurrency, gpus)

    # runs

    def to_pyarrow(self) -> pyarrow.Table:
        """Runs the chain: its rows as one pyarrow Table."""
        return _table(self._c.collect())

    def to_batches(self) -> Iterator[pyarrow.RecordBatch]:
        """Runs the chain, yielding its rows as pyarrow RecordBatches as the
        engine makes them: a result of any size is read holding a few
        batches. An error of the run is raised (of its kind's class) by the
        iteration that meets it; leaving the loop early stops the run."""
        for ipc in self._c.stream():
            yield pa.ipc.open_stream(ipc).read_next_batch()

    def to_reader(self) -> pyarrow.RecordBatchReader:
        """Runs the chain as a pyarrow RecordBatchReader that pulls each batch
        from the engine when it is read (see `to_batches`)."""
        stream = self._c.stream()
        schema = pa.ipc.read_schema(pa.py_buffer(stream.schema()))

        def batches() -> Iterator[pyarrow.RecordBatch]:
            for ipc in stream:
                yield pa.ipc.open_stream(ipc).read_next_batch()

        return pa.RecordBatchReader.from_batches(schema, batches())

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        """The Arrow PyCapsule stream interface: `pyarrow.table(chain)`,
        `pyarrow.RecordBatchReader.from_stream(chain)`, `polars.from_arrow(chain)`,
        DuckDB read the chain batch by batch as it runs (see `to_reader`).
        `requested_schema` is passed on to pyarrow's export, which casts to it."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def to_pandas(self) -> pandas.DataFrame:
        """Runs the chain: its rows as a pandas DataFrame."""
        return self.to_pyarrow().to_pandas()

    def collect(self, *cols: str) -> list[Any]:
        """Rows as dicts; `collect("a")` the values of a; `collect("a", "b")` tuples."""
        return _rows(self.to_pyarrow(), cols)

    def to_list(self, *cols: str) -> list[tuple[Any, ...]]:
        """Rows as tuples (DataChain's `to_list`): all columns, or `cols`
        (dots reach into structs: `to_list("file.path", "size")`)."""
        t = self.to_pyarrow()
        names = list(cols) if cols else t.column_names
        columns = [_values(_column(t, n)) for n in names]
        return list(zip(*columns)) if columns else [() for _ in range(t.num_rows)]

    def to_iter(self, *cols: str) -> Iterator[tuple[Any, ...]]:
        """Yields rows as tuples, batch by batch as the chain runs (DataChain's
        `to_iter`): all columns, or `cols`."""
        for batch in self.to_batches():
            t = pa.Table.from_batches([batch])
            names = list(cols) if cols else t.column_names
            yield from zip(*[_values(_column(t, n)) for n in names])

    def to_values(self, col: str) -> list[Any]:
        """The values of one column (DataChain's `to_values("file.path")`)."""
        return _values(_column(self.to_pyarrow(), col))

    def to_records(self) -> list[dict[str, Any]]:
        """Rows as dicts of leaf values, struct fields flattened with `__`
        (`file__path`), as DataChain's `to_records` does."""
        t = self.to_pyarrow()
        names: list[str] = []
        columns: list[list[Any]] = []
        for name in t.column_names:
            _flatten(name, t.column(name).combine_chunks(), names, columns)
        return [dict(zip(names, r)) for r in zip(*columns)] if columns else []

    # chain-level aggregates (DataChain's sum, avg, min, max)

    def _aggregate(self, how: str, col: Value) -> Any:
        # The Rust chain's aggregate_value (Chain::sum / avg / min / max).
        t = pa.ipc.open_stream(self._c.aggregate_value(_internal.aggregate(how, expr(col)))).read_all()
        values = _values(t.column(0))
        return values[0] if values else None

    def sum(self, col: Value) -> Any:
        """The sum of column `col` over every row (None for no rows)."""
        return self._aggregate("sum", col)

    def avg(self, col: Value) -> Any:
        """The mean of column `col` over every row (None for no rows)."""
        return self._aggregate("avg", col)

    def min(self, col: Value) -> Any:
        """The smallest value of column `col` (None for no rows)."""
        return self._aggregate("min", col)

    def max(self, col: Value) -> Any:
        """The largest value of column `col` (None for no rows)."""
        return self._aggregate("max", col)

    def count(self) -> int:
        """Runs the chain: the number of rows."""
        return self._c.count()

    def show(self, limit: int = 20) -> None:
        """Prints the first `limit` rows as a table."""
        print(self._c.to_table_string(limit))

    def _repr_html_(self) -> str:
        """Jupyter's display: the first 20 rows as an HTML table, image files
        as inline thumbnails (see `udfchain._html`)."""
        from ._html import chain_html

        return chain_html(self)

    def explain(self, analyze: bool = False) -> str:
        """The plan the engine runs (`analyze=True`: runs it and adds each
        operator's metrics)."""
        return self._c.explain(analyze)

    def save(self, name: str) -> Chain:
        """Saves the rows as the next version of dataset `name`; the chain over it."""
        ds, version, _rows_written = self._c.save(name)
        return Chain(_internal.read_dataset(ds, version), self._processes, self._setups, (f"read_dataset({ds!r}, {version})",))

    def to_pytorch(self, **kw: Any) -> Loader:
        """This chain as a training loader (`udfchain.Loader`, which takes
        these keyword arguments): a torch IterableDataset when torch imports,
        a plain iterable otherwise."""
        from ._loader import Loader

        return Loader(self, **kw)

    def to_parquet(self, uri: str) -> None:
        """Runs the chain and writes its rows as Parquet to `uri` (a local path or a store URI)."""
        self._c.to_parquet(uri)

    def to_storage(
        self,
        output: str,
        signal: str = "file",
        placement: Literal["fullpath", "filepath", "filename", "etag", "checksum"] = "fullpath",
        link_type: Literal["copy", "symlink"] = "copy",
        num_threads: int | None = None,
        anon: bool | None = None,
        client_config: dict[str, Any] | None = None,
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
