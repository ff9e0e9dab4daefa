"""DataChain's dataset verbs (diff, file_diff, subtract, shuffle, sample,
chunk, ...), each compared with the same result computed in plain Python."""

from pathlib import Path
from typing import Any

import pytest

import udfchain as uc

Row = tuple[int, Any, int]


def versions() -> tuple[list[Row], list[Row]]:
    """Two versions of (id, value, n): ids 0..39 and 10..49, some values
    changed, some null."""

    def value(i: int, v: int) -> str | None:
        if (i + v) % 7 == 0:
            return None
        return f"v{v}-{i}" if i % 5 == 0 else str(i)

    new = [(i, value(i, 1), i) for i in range(40)]
    old = [(i, value(i, 2), i) for i in range(10, 50)]
    return new, old


def chain(rows: list[Row]) -> uc.Chain:
    return uc.read_values(id=[r[0] for r in rows], value=[r[1] for r in rows], n=[r[2] for r in rows])


def expected(new: list[Row], old: list[Row], keep: str) -> set[tuple[int, Any, int, str]]:
    n = {r[0]: r for r in new}
    o = {r[0]: r for r in old}
    out = set()
    for i, r in n.items():
        if i not in o:
            s = "A"
        elif r[1] is None or o[i][1] is None or r != o[i]:
            s = "M"
        else:
            s = "S"
        if s in keep:
            out.add((*r, s))
    for i, r in o.items():
        if i not in n and "D" in keep:
            out.add((*r, "D"))
    return out


@pytest.mark.parametrize("keep", ["ADM", "ADMS", "A", "D", "M", "S"])
def test_diff_is_a_set_difference(keep: str) -> None:
    new, old = versions()
    d = chain(new).diff(
        chain(old),
        on="id",
        added="A" in keep,
        deleted="D" in keep,
        modified="M" in keep,
        same="S" in keep,
        status_col="status",
    )
    assert set(d.collect("id", "value", "n", "status")) == expected(new, old, keep)


def test_diff_without_status_and_with_renamed_keys() -> None:
    new, old = versions()
    d = chain(new).diff(chain(old), on="id")
    assert d.to_pyarrow().column_names == ["id", "value", "n"]
    assert set(d.collect("id", "value", "n")) == {r[:3] for r in expected(new, old, "ADM")}
    other = uc.read_values(key=[r[0] for r in old], val=[r[1] for r in old], n=[r[2] for r in old])
    d = chain(new).diff(
        other, on="id", right_on="key", compare=["value", "n"], right_compare=["val", "n"], same=True, status_col="s"
    )
    assert set(d.collect("id", "value", "n", "s")) == expected(new, old, "ADMS")


def test_file_diff(tmp_path: Path) -> None:
    data = tmp_path / "files"
    data.mkdir()
    for i in range(5):
        (data / f"f{i}.txt").write_text(f"one {i}")
    uc.read_storage(str(data)).save("listing")
    (data / "f0.txt").write_text("rewritten, longer")
    (data / "f4.txt").unlink()
    (data / "f5.txt").write_text("new")
    d = uc.read_storage(str(data)).file_diff(uc.read_dataset("listing"), status_col="st")
    assert sorted(d.collect("st", "file.path")) == [("A", "f5.txt"), ("M", "f0.txt")]
    d = uc.read_storage(str(data)).file_diff(uc.read_dataset("listing"), deleted=True, same=True, status_col="st")
    got = {p: s for s, p in d.collect("st", "file.path")}
    assert got == {"f0.txt": "M", "f1.txt": "S", "f2.txt": "S", "f3.txt": "S", "f4.txt": "D", "f5.txt": "A"}


def test_subtract() -> None:
    new, old = versions()
    got = set(chain(new).subtract(chain(old), on="id").collect("id", "value", "n"))
    assert got == {r for r in new if r[0] not in {o[0] for o in old}}
    # All columns; a null equals nothing, so rows with a null value stay.
    got = set(chain(new).subtract(chain(old)).collect("id", "value", "n"))
    same = {r for r in old if r[1] is not None}
    assert got == {r for r in new if r not in same}


def test_shuffle_sample_repeat_for_a_seed() -> None:
    c = uc.read_values(id=list(range(100)))
    a = c.shuffle(seed=5).collect("id")
    assert a == c.shuffle(seed=5).collect("id")
    assert sorted(a) == list(range(100)) and a != list(range(100))
    assert a != c.shuffle(seed=6).collect("id")
    s = c.sample(10, seed=5).collect("id")
    assert s == a[:10] and s == c.sample(10, seed=5).collect("id")
    assert c.sample(1000).count() == 100
    assert len(set(c.sample(30).collect("id"))) == 30


def test_chunks_cover_every_row_once() -> None:
    c = uc.read_values(id=list(range(250)), s=[str(i % 7) for i in range(250)])
    for total in range(1, 8):
        parts = [c.chunk(i, total).collect("id") for i in range(total)]
        assert sorted(x for p in parts for x in p) == list(range(250)), total
        assert parts == [c.chunk(i, total).collect("id") for i in range(total)]
    with pytest.raises(Exception, match="chunk"):
        c.chunk(2, 2).count()


def test_merge_left_inner_full_and_renamed_columns() -> None:
    left = uc.read_values(id=[1, 2, 3], name=["a", "b", "c"])
    right = uc.read_values(id=[2, 3, 4], name=["B", "C", "D"], score=[0.2, 0.3, 0.4])
    m = left.merge(right, on="id")
    assert m.to_pyarrow().column_names == ["id", "name", "right_id", "right_name", "score"]
    r = {2: ("B", 0.2), 3: ("C", 0.3), 4: ("D", 0.4)}
    want = {(i, n, i if i in r else None, *(r.get(i) or (None, None))) for i, n in [(1, "a"), (2, "b"), (3, "c")]}
    assert set(m.to_list()) == want
    assert set(left.merge(right, on="id", inner=True).to_list()) == {w for w in want if w[2] is not None}
    full = set(left.merge(right, on="id", full=True, rname="r_").to_list())
    assert full == want | {(None, None, 4, "D", 0.4)}
    other = uc.read_values(key=[1], label=["one"])
    assert left.merge(other, on="id", right_on="key", inner=True).to_list() == [(1, "a", 1, "one")]


def test_outputs_and_aggregates() -> None:
    c = uc.read_records([{"x": 1, "s": "a"}, {"x": 5, "s": "b"}, {"x": 3, "s": None}], schema={"x": int, "s": str})
    assert c.to_pyarrow().schema.field("x").type == "int64"
    assert c.order_by("x").to_list() == [(1, "a"), (3, None), (5, "b")]
    assert c.order_by("x").to_list("s") == [("a",), (None,), ("b",)]
    assert c.order_by("x").to_values("x") == [1, 3, 5]
    assert sorted(c.to_iter("x")) == [(1,), (3,), (5,)]
    assert sorted(c.to_records(), key=lambda r: r["x"]) == [
        {"x": 1, "s": "a"},
        {"x": 3, "s": None},
        {"x": 5, "s": "b"},
    ]
    xs = [1, 5, 3]
    assert (c.sum("x"), c.avg("x"), c.min("x"), c.max("x")) == (sum(xs), sum(xs) / 3, min(xs), max(xs))
    assert c.filter(uc.C("x") > 10).max("x") is None


def test_read_pandas_and_file_records(files: tuple[Path, dict[str, bytes]]) -> None:
    import pandas as pd

    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    assert uc.read_pandas(df).order_by("a").to_list() == [(1, "x"), (2, "y")]
    d, data = files
    recs = uc.read_storage(str(d)).to_records()
    assert sorted(r["file__path"] for r in recs) == sorted(data)
    assert uc.read_storage(str(d)).sum("file.size") == sum(len(b) for b in data.values())
    assert sorted(uc.read_storage(str(d)).to_values("file.path")) == sorted(data)


def test_diff_refuses_what_datachain_refuses() -> None:
    new, old = versions()
    with pytest.raises(ValueError, match="At least one"):
        chain(new).diff(chain(old), on="id", added=False, deleted=False, modified=False)
    with pytest.raises(ValueError, match="'compare' must be defined"):
        chain(new).diff(chain(old), on="id", right_compare="value")
    with pytest.raises(ValueError, match="same length"):
        chain(new).diff(chain(old), on="id", right_on=["id", "n"])


def test_explode_matches_json_loads() -> None:
    import json

    texts = ['{"a": 1, "b": "x"}', None, '{"a": 2, "c": [1]}', '{"b": "z"}']
    c = uc.read_values(id=[0, 1, 2, 3], meta=texts)
    got = c.explode("meta", schema_sample_size=3).order_by("id").to_values("meta_expl")
    want = []
    for t in texts:
        d = json.loads(t) if t else None
        want.append(None if d is None else {"a": d.get("a"), "b": d.get("b"), "c": d.get("c")})
    assert got == want
    assert c.explode("meta", column="m").to_pyarrow().column_names == ["id", "meta", "m"]
    bad = uc.read_values(id=[0, 1], meta=['{"a": 1}', "[1, 2]"])
    with pytest.raises(Exception, match=r"explode\(meta\): row 1"):
        bad.explode("meta").to_list()
