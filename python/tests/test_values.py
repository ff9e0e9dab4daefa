"""The engine's own conversions (python/src/values.rs) agree with pyarrow's.

Plain columns reach a UDF as Python lists the engine builds, and plain outputs
are converted by the engine; everything else goes through pyarrow. These tests
hold the two to one behaviour: the values a UDF sees are `to_pylist()`'s, and
an output converts exactly when pyarrow converts it, to the same array.
"""

import enum
import math
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest

import udfchain as uc
from pathlib import Path

PLAIN = {
    "i8": pa.array([-128, None, 127], pa.int8()),
    "i16": pa.array([-32768, 0, None], pa.int16()),
    "i32": pa.array([None, -(2**31), 2**31 - 1], pa.int32()),
    "i64": pa.array([-(2**63), 2**63 - 1, None], pa.int64()),
    "u8": pa.array([0, 255, None], pa.uint8()),
    "u16": pa.array([None, 65535, 1], pa.uint16()),
    "u32": pa.array([2**32 - 1, None, 0], pa.uint32()),
    "u64": pa.array([2**64 - 1, 0, None], pa.uint64()),
    "f32": pa.array([0.1, None, float("inf")], pa.float32()),
    "f64": pa.array([0.1, -0.0, None], pa.float64()),
    "flag": pa.array([True, None, False], pa.bool_()),
    "s": pa.array(["", "日本 \x00 é", None], pa.string()),
    "ls": pa.array([None, "large", "x" * 1000], pa.large_string()),
    "b": pa.array([b"\x00\xff", None, b""], pa.binary()),
    "lb": pa.array([b"large", b"", None], pa.large_binary()),
    "nothing": pa.array([None, None, None], pa.null()),
}


def seen(chain: uc.Chain, names: Iterable[str]) -> list[str]:
    """repr() of the tuple of values each row's UDF call received, by row."""

    def show(*values: object) -> str:
        return repr(values)

    out: list[str] = chain.map(out=show, params=list(names)).to_pyarrow().column("out").to_pylist()
    return out


def test_plain_columns_arrive_as_pyarrow_gives_them() -> None:
    table = pa.table(PLAIN)
    got = seen(uc.read_values(**PLAIN), PLAIN)
    want = [repr(tuple(table.column(n)[i].as_py() for n in PLAIN)) for i in range(3)]
    assert got == want
    # f32 widened as pyarrow widens it (not rounded to 0.1)
    assert repr(pa.array([0.1], pa.float32())[0].as_py()) in got[0]


def test_a_nested_column_beside_plain_ones_goes_through_pyarrow() -> None:
    cols = {"n": pa.array([1, 2], pa.int64()), "l": pa.array([[1, None], []], pa.list_(pa.int64()))}
    assert seen(uc.read_values(**cols), cols) == ["(1, [1, None])", "(2, [])"]


class Color(enum.IntEnum):
    RED = 1


class Text(str):
    pass


# (type, values): each list is one call's outputs (a batch_map over 1 row each
# would not mix types in one array, so the values go out of one map over rows).
CASES = [
    (pa.int64(), [1, None, -(2**63), 2**63 - 1]),
    (pa.int64(), [True, 2]),
    (pa.int64(), [2**63]),
    (pa.int64(), [Color.RED, 3]),
    (pa.int64(), [1.0]),
    (pa.int64(), ["1"]),
    (pa.float64(), [0.5, None, float("nan"), -0.0]),
    (pa.float64(), [1, 2.5]),
    (pa.float64(), [2**70]),
    (pa.float64(), [True]),
    (pa.bool_(), [True, None, False]),
    (pa.bool_(), [1, 0]),
    (pa.string(), ["a", None, "日本", ""]),
    (pa.string(), [Text("sub"), "x"]),
    (pa.string(), ["\ud800"]),
    (pa.string(), [b"bytes"]),
    (pa.binary(), [b"a", None, b""]),
    (pa.binary(), [bytearray(b"ba"), memoryview(b"mv")]),
    (pa.binary(), ["text"]),
]


@pytest.mark.parametrize("t,values", CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_plain_outputs_convert_exactly_when_pyarrow_does(t: pa.DataType, values: list[Any]) -> None:
    try:
        want = pa.array(values, type=t)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        want = None

    def pick(i: int) -> Any:
        return values[i]

    chain = uc.read_values(i=list(range(len(values)))).map(out=pick, output=t).order_by("i")
    if want is None:
        with pytest.raises(uc.UdfchainError, match="pick"):
            chain.to_pyarrow()
        return
    got = chain.to_pyarrow().column("out")
    assert got.type == t
    got, want = got.to_pylist(), want.to_pylist()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, float) and math.isnan(w):
            assert math.isnan(g)
        else:
            assert g == w and type(g) is type(w)
            if isinstance(w, float):
                assert math.copysign(1, g) == math.copysign(1, w)


def test_file_objects_carry_every_field(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files

    def fields(file: uc.File) -> str:
        return repr(file.as_dict())

    chain = uc.read_storage(str(d)).order_by("file.path")
    got = chain.map(out=fields).collect("out")
    listed = [f.as_dict() for f in chain.collect("file")]
    assert got == [repr(f) for f in listed]
    assert [f["path"] for f in listed] == sorted(data)
    assert all(f["size"] == len(data[f["path"]]) and f["last_modified"] is not None for f in listed)
