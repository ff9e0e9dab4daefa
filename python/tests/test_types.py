"""Output types from annotations (or an explicit type) and values that do not match."""

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any, Optional, TypedDict

import pyarrow as pa
import pytest

import udfchain as uc
from pathlib import Path


@dataclasses.dataclass
class Meta:
    width: int
    height: int
    tags: list[str]
    note: Optional[str]


class Point(TypedDict):
    x: float
    y: float


def one(fn: Callable[..., Any], **kw: Any) -> tuple[pa.DataType, list[Any]]:
    t = uc.read_values(num=[1, 2]).map(out=fn, **kw).order_by("num").to_pyarrow()
    return t.schema.field("out").type, t.column("out").to_pylist()


def test_scalars() -> None:
    def i(num: int) -> int:
        return num * 10

    def f(num: int) -> float:
        return num / 2

    def s(num: int) -> str:
        return str(num)

    def b(num: int) -> bytes:
        return bytes([num])

    def flag(num: int) -> bool:
        return num > 1

    def when(num: int) -> datetime.datetime:
        return datetime.datetime(2024, 1, num)

    assert one(i) == (pa.int64(), [10, 20])
    assert one(f) == (pa.float64(), [0.5, 1.0])
    assert one(s) == (pa.string(), ["1", "2"])
    assert one(b) == (pa.binary(), [b"\x01", b"\x02"])
    assert one(flag) == (pa.bool_(), [False, True])
    assert one(when) == (pa.timestamp("us"), [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 2)])


def test_containers_and_structs() -> None:
    def maybe(num: int) -> Optional[int]:
        return None if num == 1 else num

    def many(num: int) -> list[int]:
        return list(range(num))

    def named(num: int) -> dict[str, int]:
        return {"n": num}

    def meta(num: int) -> Meta:
        return Meta(num, num * 2, ["a"] * num, None)

    def point(num: int) -> Point:
        return {"x": float(num), "y": 0.0}

    assert one(maybe) == (pa.int64(), [None, 2])
    assert one(many) == (pa.list_(pa.int64()), [[0], [0, 1]])
    t, v = one(named)
    assert t == pa.map_(pa.string(), pa.int64()) and v == [[("n", 1)], [("n", 2)]]
    t, v = one(meta)
    assert t == pa.struct([("width", pa.int64()), ("height", pa.int64()), ("tags", pa.list_(pa.string())), ("note", pa.string())])
    assert v[1] == {"width": 2, "height": 4, "tags": ["a", "a"], "note": None}
    t, v = one(point)
    assert t == pa.struct([("x", pa.float64()), ("y", pa.float64())]) and v[0] == {"x": 1.0, "y": 0.0}


def test_explicit_output_type() -> None:
    def anything(num):  # type: ignore[no-untyped-def]  # no return annotation, on purpose
        return num

    assert one(anything, output=pa.int32()) == (pa.int32(), [1, 2])
    with pytest.raises(TypeError, match="no return annotation"):
        uc.read_values(num=[1]).map(out=anything)


def test_mismatch_names_udf_file_and_row(files: tuple[Path, dict[str, bytes]]) -> None:
    d, _ = files

    def size_or_text(file: uc.File) -> int:
        return "big" if file.path == "f002.bin" else file.size  # type: ignore[return-value]

    with pytest.raises(uc.UdfchainError) as e:
        uc.read_storage(str(d)).order_by("file.path").map(n=size_or_text).collect()
    msg = str(e.value)
    assert "size_or_text" in msg and "f002.bin" in msg and "(row 2)" in msg
    assert "'big'" in msg and "int64" in msg


def test_unsupported_annotation() -> None:
    def weird(num: int) -> set[int]:
        return {num}

    with pytest.raises(TypeError, match="UDF weird: no Arrow type"):
        uc.read_values(num=[1]).map(out=weird)
