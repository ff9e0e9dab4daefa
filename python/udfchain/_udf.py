"""Python functions as engine UDFs: the invokers the Rust `PyUdf` calls.

An `Invoker` gets one call's rows (exactly the UDF's params columns, in
order) as Python lists the engine built (plain column types) or as an Arrow
IPC stream (any type; worker processes), calls the function, and returns its
values (the engine converts plain types itself) or an IPC stream. Guarantees:
File columns arrive as `udfchain.File` objects, other columns as the values
`to_pylist()` gives; an exception of the function (or a value that does not
convert) is raised as `UdfFailure` with the row it happened at (when known)
and the Python traceback, which the engine puts in its error naming the UDF
and the file.
"""

from __future__ import annotations

import functools
import inspect
import operator
import traceback
import typing
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ._pyarrow import pa

from ._file import files_of, is_file_type
from ._types import ConvertError, arrow_type, element_type, to_array

if TYPE_CHECKING:
    import pyarrow

    from ._file import Access
    from ._state import Life, Setups


class UdfFailure(Exception):
    """A UDF call's failure: `row` within the call (None: the whole call),
    `text`; `setup`: the UDF's setup failed (the engine fails the run,
    whatever `on_error` says)."""

    def __init__(self, row: int | None, text: str, setup: bool = False) -> None:
        super().__init__(text)
        self.row = row
        self.text = text
        self.setup = setup


def setup_failure(name: str, e: BaseException) -> UdfFailure:
    """The failure of UDF `name`'s setup, with the traceback."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    return UdfFailure(None, f"the setup of UDF {name} raised: {text}", setup=True)


def _failure(name: str, row: int | None, e: BaseException) -> UdfFailure:
    if isinstance(e, ConvertError):
        return UdfFailure(row if row is not None else e.row, f"{name} {e}")
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    return UdfFailure(row, text)


def _columns(ipc: bytes, access: Access | None) -> list[list[Any]]:
    table = pa.ipc.open_stream(ipc).read_all()
    out: list[list[Any]] = []
    for col in table.columns:
        if is_file_type(col.type):
            out.append(files_of(col, access))
        elif is_image_type(col.type):
            out.append(images_of(col))
        else:
            out.append(col.to_pylist())
    return out


_IMAGE_FIELDS = ("width", "height", "mode", "data")
_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}


def is_image_type(t: pyarrow.DataType) -> bool:
    """Whether `t` is the engine's image struct (docs/images.md)."""
    return bool(pa.types.is_struct(t)) and tuple(t.field(i).name for i in range(t.num_fields)) == _IMAGE_FIELDS


def images_of(col: Any) -> Images:
    """An image column as numpy arrays (height, width, channels) of uint8,
    each a view of the Arrow buffer (no copy); None for a null row."""
    import numpy as np

    out = Images()
    for chunk in col.chunks:
        width, height, mode, data = chunk.flatten()
        offsets = np.frombuffer(data.buffers()[1], dtype=np.int32)[data.offset : data.offset + len(data) + 1]
        values = data.buffers()[2]
        modes = mode.to_pylist()
        first = len(out)
        for i in range(len(chunk)):
            if not chunk[i].is_valid:
                out.append(None)
                continue
            h, w, c = height[i].as_py(), width[i].as_py(), _CHANNELS[modes[i]]
            start = int(offsets[i])
            pixels = np.frombuffer(values, dtype=np.uint8, count=h * w * c, offset=start) if h * w * c else np.empty(0, np.uint8)
            out.append(pixels.reshape(h, w, c))
        out._runs.append((first, len(out), values, int(offsets[0]) if len(chunk) else 0))
    return out


class Images(list[Any]):
    """The images of a batch (a list of (H, W, C) uint8 arrays, None for a
    null row) that numpy sees as one (N, H, W, C) array: `np.asarray(images)`
    is a view of the Arrow buffer, no copy, when every image has one shape
    and they lie back to back (as a column of one `image_resize` does);
    otherwise it is stacked (a copy). A null row cannot be stacked."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._runs: list[tuple[int, int, Any, int]] = []  # (first row, end row, buffer, byte offset of the first row)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        import numpy as np

        if any(a is None for a in self):
            raise ValueError("a batch with a null image (a row that did not decode) cannot be one array")
        shapes = {a.shape for a in self}
        if len(shapes) > 1:
            raise ValueError(f"images of different shapes cannot be one array: {sorted(shapes)[:3]}; resize them first")
        whole = self._view(shapes.pop()) if len(self._runs) == 1 and copy is not True else None
        array = whole if whole is not None else (np.stack(self) if self else np.empty((0, 0, 0, 0), np.uint8))
        return array if dtype is None else array.astype(dtype, copy=False)

    def _view(self, shape: tuple[int, ...]) -> Any:
        import numpy as np

        first, end, buffer, offset = self._runs[0]
        if first != 0 or end != len(self):
            return None
        size = int(np.prod(shape))
        view = np.frombuffer(buffer, dtype=np.uint8, count=size * len(self), offset=offset) if size else None
        start = view.__array_interface__["data"][0] if view is not None else 0
        # Back to back: each image starts where the previous ended.
        if view is None or any(
            a.__array_interface__["data"][0] != start + i * size for i, a in enumerate(self)
        ):
            return None
        return view.reshape((len(self), *shape))


class _Encoder:
    """Output values of one type as an IPC stream: the schema message made
    once (on first use: a worker process may never need pyarrow), then per
    call one record batch message and the end marker. `t` is the Arrow type,
    or the IPC schema of one field of it (what crosses to a worker)."""

    _EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"

    def __init__(self, t: pyarrow.DataType | bytes) -> None:
        self._t = t
        self.t: pyarrow.DataType | None = None

    def __call__(self, values: list[Any]) -> bytes:
        if self.t is None:
            # Calls run at once on several threads: `t` is set last, so a
            # call that sees it also sees the schema and the head.
            t = self._t
            if isinstance(t, bytes):
                t = pa.ipc.read_schema(pa.py_buffer(t)).field(0).type
            self.schema = pa.schema([pa.field("value", t)])
            self.head = self.schema.serialize().to_pybytes()
            self.t = t
        array = to_array(values, self.t)
        batch = pa.RecordBatch.from_arrays([array], schema=self.schema)
        return b"".join((self.head, bytes(batch.serialize().to_pybytes()), self._EOS))


def schema_ipc(name: str, t: pyarrow.DataType) -> bytes:
    """The IPC schema of a UDF's one output field."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([pa.field(name, t)])):
        pass
    return bytes(sink.getvalue().to_pybytes())


def params_of(
    fn: Callable[..., Any], params: str | typing.Sequence[str] | None, setups: typing.AbstractSet[str] = frozenset()
) -> list[str]:
    """The columns a UDF reads: `params`, else its positional parameters'
    names but those that name a `Chain.setup` value (in `setups`)."""
    if params is not None:
        return [params] if isinstance(params, str) else list(params)
    sig = inspect.signature(fn)
    names = [
        p.name
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        and p.name not in setups
    ]
    if not names:
        raise TypeError(f"UDF {_name(fn)} takes no parameter: it must read at least one column")
    return names


def _name(fn: Callable[..., Any]) -> str:
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, type):  # a class UDF's process
        return type(owner).__name__
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name else type(fn).__name__


def setup_params(fn: Callable[..., Any], setups: Setups | None) -> list[str]:
    """The parameters of `fn` that name a `Chain.setup` value."""
    if not setups:
        return []
    names = setups.names()
    return [p for p in inspect.signature(fn).parameters if p in names]


def output_type(fn: Callable[..., Any], output: Any, kind: str) -> pyarrow.DataType:
    """The Arrow type of a UDF's values: `output`, else its return annotation."""
    where = f"UDF {_name(fn)}"
    if output is not None:
        return arrow_type(output, where)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = getattr(fn, "__annotations__", {})
    if "return" not in hints:
        raise TypeError(f"{where} has no return annotation: annotate it or pass output=")
    ret = hints["return"]
    if kind != "map":
        ret = element_type(ret, where)
    return arrow_type(ret, where)


class Invoker:
    """`fn` as a UDF of `kind` with values of type `t` (an Arrow type, or the
    IPC schema of one field of it), called by the engine.

    Two ways in, one behaviour: `values(cols, access)` / `gen(cols, access,
    max_rows)` take the rows as Python lists the engine built itself
    (`python/src/values.rs`, for plain column types) and return the values
    unconverted (a list; the engine converts plain types itself and asks
    `encode` for the rest); `invoker(ipc, access[, max_rows])` takes an Arrow
    IPC stream (any column type) and returns IPC streams. Files in `cols`
    already read through `access`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        kind: str,
        t: pyarrow.DataType | bytes,
        life: Life | None = None,
        concurrency: int | None = None,
    ) -> None:
        self.fn = fn
        self.kind = kind
        self.name = _name(fn)
        self._encode = _Encoder(t)
        self.life = life
        # Read once by the engine (`InvokerInfo`).
        self.stateful = life is not None and life.stateful
        self.concurrency = concurrency

    def setup(self) -> None:
        """Builds the UDF's state (the engine calls it once per run before
        the first call); a failure is `UdfFailure` with `setup` set."""
        try:
            if self.life is not None:
                self.life.setup()
        except Exception as e:
            raise setup_failure(self.name, e) from None

    def teardown(self) -> None:
        if self.life is not None:
            self.life.teardown()

    def _fn(self) -> Callable[..., Any]:
        """The function with the `Chain.setup` values it takes bound."""
        values = self.life.values if self.life is not None else None
        return functools.partial(self.fn, **values) if values else self.fn

    def __call__(self, ipc: bytes, access: Access, *rest: int) -> bytes | Iterator[bytes]:
        cols = _columns(ipc, access)
        if self.kind == "gen":
            return (self.encode(chunk) for chunk in self.gen(cols, access, *rest))
        return self.encode(self.values(cols, access))

    def values(self, cols: list[list[Any]], access: Access | None = None) -> list[Any]:
        """The outputs of one call (one per row for map and batch_map)."""
        fn, name = self._fn(), self.name
        if self.kind != "map":
            try:
                return list(fn(*cols))
            except Exception as e:
                raise _failure(name, None, e) from None
        # One map() over the columns: no per-row Python work but the call. On
        # an exception, the first column's iterator says which row raised.
        first = iter(cols[0])
        try:
            out = list(map(fn, first, *cols[1:]))
        except Exception as e:
            raise _failure(name, len(cols[0]) - 1 - operator.length_hint(first), e) from None
        if len(out) != len(cols[0]):  # a StopIteration out of fn ends map() early
            raise _failure(name, len(out), RuntimeError(f"{name} raised StopIteration"))
        return out

    def encode(self, out: list[Any]) -> bytes:
        """`out` as an IPC stream, or UdfFailure at the first value that does not convert."""
        try:
            return self._encode(out)
        except Exception as e:  # ConvertError names its row; a generator has one
            raise _failure(self.name, 0 if self.kind == "gen" else None, e) from None

    def gen(self, cols: list[list[Any]], access: Access | None, max_rows: int) -> Iterator[list[Any]]:
        """A generator's values in chunks (lists) of at most `max_rows`."""
        chunk: list[Any] = []
        try:
            for v in self._fn()(*[c[0] for c in cols]):
                chunk.append(v)
                if len(chunk) >= max_rows:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk
        except Exception as e:
            raise _failure(self.name, 0, e) from None


def invoker(
    fn: Callable[..., Any],
    kind: str,
    t: pyarrow.DataType,
    life: Life | None = None,
    concurrency: int | None = None,
) -> Invoker:
    """The invoker of `fn` as a UDF of `kind` with values of type `t`
    (`life`: its `_state.Life`, when it has state)."""
    if kind not in ("map", "batch_map", "agg", "gen"):
        raise ValueError(f"unknown UDF kind {kind!r}")
    return Invoker(fn, kind, t, life, concurrency)
