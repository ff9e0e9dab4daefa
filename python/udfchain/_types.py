"""Python types to Arrow types, and Python values to Arrow arrays.

Guarantees: a UDF's output type comes from its return annotation (int, float,
str, bytes, bool, datetime, date, Optional, list[T], dict[str, T],
dataclasses, TypedDict, pydantic models, udfchain.File) or from an explicit
pyarrow type or Python type; anything else is a TypeError naming the UDF. A
value that does not convert fails naming the row and the value's type.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import datetime
import functools
import types
import typing
from typing import TYPE_CHECKING, Any

from ._pyarrow import pa

if TYPE_CHECKING:
    import pyarrow

from ._file import File, file_type

@functools.cache
def _scalars() -> dict[Any, pyarrow.DataType]:
    return {
        int: pa.int64(),
        float: pa.float64(),
        str: pa.string(),
        bytes: pa.binary(),
        bool: pa.bool_(),
        datetime.datetime: pa.timestamp("us"),
        datetime.date: pa.date32(),
    }


# Containers whose element type is a generator's, batch_map's or agg's value type.
_ITERABLES = (
    cabc.Iterator,
    cabc.Iterable,
    cabc.Generator,
    cabc.Sequence,
    list,
    tuple,
)


def _is_pydantic(t: Any) -> bool:
    return isinstance(t, type) and hasattr(t, "model_fields") and hasattr(t, "model_dump")


def _is_typeddict(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, dict) and hasattr(t, "__annotations__") and hasattr(t, "__total__")


def arrow_type(t: Any, where: str) -> pyarrow.DataType:
    """The Arrow type of annotation `t` (`where` names the UDF in errors)."""
    if isinstance(t, pa.DataType):
        return t
    if t is File:
        return file_type()
    if t in _scalars():
        return _scalars()[t]
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return arrow_type(rest[0], where)
        raise TypeError(f"{where}: a union of {rest} has no Arrow type; use Optional[T]")
    if origin in (list, cabc.Sequence, cabc.Iterable) and len(args) == 1:
        return pa.list_(arrow_type(args[0], where))
    if origin is dict and len(args) == 2:
        if args[0] is not str:
            raise TypeError(f"{where}: dict keys must be str, got {args[0]}")
        return pa.map_(pa.string(), arrow_type(args[1], where))
    if dataclasses.is_dataclass(t) and isinstance(t, type):
        hints = typing.get_type_hints(t)
        return pa.struct([pa.field(f.name, arrow_type(hints[f.name], where)) for f in dataclasses.fields(t)])
    if _is_typeddict(t):
        hints = typing.get_type_hints(t)
        return pa.struct([pa.field(k, arrow_type(v, where)) for k, v in hints.items()])
    if _is_pydantic(t):
        return pa.struct(
            [pa.field(k, arrow_type(f.annotation, where)) for k, f in t.model_fields.items()]
        )
    raise TypeError(f"{where}: no Arrow type for {t!r}; annotate with a supported type or pass output=")


def element_type(t: Any, where: str) -> Any:
    """The value type of an iterable annotation (Iterator[T], list[T], ...)."""
    origin = typing.get_origin(t)
    if origin in _ITERABLES and typing.get_args(t):
        return typing.get_args(t)[0]
    raise TypeError(f"{where}: annotate the return as Iterator[T] or list[T] (got {t!r}), or pass output=")


def plain(v: Any) -> Any:
    """A value pyarrow converts: dataclasses, pydantic models and Files as dicts."""
    if v is None or isinstance(v, (int, float, str, bytes, bool, datetime.date)):
        return v
    if isinstance(v, File):
        return v.as_dict()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if hasattr(v, "model_dump") and callable(v.model_dump):
        return plain(v.model_dump())
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


class ConvertError(Exception):
    """A value that does not convert to the declared type, at `row`."""

    def __init__(self, row: int, message: str):
        super().__init__(message)
        self.row = row


def to_array(values: list[Any], t: pyarrow.DataType) -> pyarrow.Array:
    """`values` as an array of type `t`, or ConvertError at the first bad row.
    Values of a flat type go to pyarrow as they are (no per-value Python work);
    those of a nested type through `plain` first."""
    nested = pa.types.is_nested(t)
    if nested:
        values = [plain(v) for v in values]
    try:
        return pa.array(values, type=t)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    for row, v in enumerate(values):
        try:
            pa.array([v if nested else plain(v)], type=t)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise ConvertError(row, f"returned {type(v).__name__} {v!r:.80}, which is not {t}: {e}") from None
    raise ConvertError(0, f"returned values that are not {t}")
