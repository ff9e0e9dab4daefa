"""The chain in DataChain's words, without UDFs: sources, relational steps,
runs, datasets, settings, SQL."""

import pyarrow as pa
import pytest

import udfchain as uc
from pathlib import Path


def nums() -> uc.Chain:
    return uc.read_values(num=[3, 1, 2, 5, 4], name=["c", "a", "b", "e", "d"])


def test_relational_steps() -> None:
    c = nums()
    assert c.count() == 5
    assert c.filter(uc.C("num") > 2).order_by("num").collect("num") == [3, 4, 5]
    assert c.filter((uc.C("num") > 1) & ~(uc.C("name") == "e")).count() == 3
    assert c.order_by("num", descending=True).limit(2).collect("name") == ["e", "d"]
    assert c.order_by("num").offset(3).collect("num") == [4, 5]
    assert c.mutate(double=uc.C("num") * 2).order_by("num").collect("double") == [2, 4, 6, 8, 10]
    assert c.select("name").order_by("name").collect() == [{"name": n} for n in "abcde"]
    assert c.union(nums()).distinct().count() == 5
    rows = c.order_by("num").collect("num", "name")
    assert rows[0] == (1, "a")


def test_group_by_and_join() -> None:
    c = uc.read_values(k=["x", "y", "x", "x"], v=[1, 2, 3, 4])
    g = c.group_by(partition_by="k", n=uc.func.count(), total=uc.func.sum("v")).order_by("k")
    assert g.collect("k", "n", "total") == [("x", 3, 8), ("y", 1, 2)]
    names = uc.read_values(key=["x", "y"], label=["ex", "why"])
    j = c.join(names, on="k", right_on="key").order_by("v")
    assert j.collect("v", "label") == [(1, "ex"), (2, "why"), (3, "ex"), (4, "ex")]


def test_runs_to_arrow() -> None:
    c = nums()
    t = c.to_pyarrow()
    assert t.num_rows == 5 and t.column_names == ["num", "name"]
    # __arrow_c_stream__: pyarrow (and Polars, DuckDB) read the chain directly.
    assert pa.table(c).equals(t)
    empty = c.filter(uc.C("num") > 100).to_pyarrow()
    assert empty.num_rows == 0 and empty.column_names == ["num", "name"]
    assert "num" in c.explain()


def test_to_pandas_with_pandas_installed(files: tuple[Path, dict[str, bytes]]) -> None:
    pd = pytest.importorskip("pandas", reason="pandas is not installed (python/test.sh installs it)")
    df = nums().order_by("num").to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert df["num"].tolist() == [1, 2, 3, 4, 5] and df["name"].tolist() == list("abcde")
    d, data = files
    frame = uc.read_storage(str(d)).order_by("file.path").to_pandas()
    assert [f["path"] for f in frame["file"]] == sorted(data)
    assert [f["size"] for f in frame["file"]] == [len(data[k]) for k in sorted(data)]


def test_show(capsys: pytest.CaptureFixture[str]) -> None:
    nums().order_by("num").show(2)
    out = capsys.readouterr().out
    assert "| 1" in out and "| 2" in out and "| 3" not in out


def test_save_and_versions(root: Path) -> None:
    nums().save("numbers")
    nums().filter(uc.C("num") > 3).save("numbers")
    assert (root / "catalog.db").exists() or any(root.iterdir())
    assert uc.read_dataset("numbers").count() == 2
    assert uc.read_dataset("numbers", version=1).count() == 5
    saved = nums().save("again")
    assert sorted(saved.collect("num")) == [1, 2, 3, 4, 5]


def test_file_sources(tmp_path: Path) -> None:
    csv = tmp_path / "a.csv"
    csv.write_text("x,y\n1,one\n2,two\n")
    assert uc.read_csv(str(csv)).order_by("x").collect("y") == ["one", "two"]
    js = tmp_path / "a.json"
    js.write_text('{"x": 1}\n{"x": 2}\n')
    assert sorted(uc.read_json(str(js)).collect("x")) == [1, 2]
    pq = tmp_path / "a.parquet"
    nums().to_parquet(str(pq))
    assert sorted(uc.read_parquet(str(pq)).collect("num")) == [1, 2, 3, 4, 5]


def test_settings_refused_as_set_refuses() -> None:
    with pytest.raises(uc.UdfchainError, match="did you mean prefetch"):
        nums().settings(prefech=4)  # type: ignore[call-arg]
    with pytest.raises(uc.UdfchainError, match="fail, skip or null"):
        nums().settings(on_error="retry")  # type: ignore[arg-type]
    # every setting of the Rust API is accepted by name
    nums().settings(
        prefetch="auto", cache=False, cache_limit="1g", parallel=2, workers=1, batch_size=10,
        ordered=True, max_connections=8, on_error="skip", root="/tmp/x", memory_limit="1g",
        memory_file_limit=0, temp_dir_limit="10g", progress=False, cluster="local", storage={"region": "x"},
    )


def test_expression_errors() -> None:
    with pytest.raises(TypeError, match="truth value"):
        bool(uc.C("a") > 1)
    with pytest.raises(TypeError, match="cannot use a list"):
        uc.C("a") == [1]
    with pytest.raises(uc.UdfchainError, match="nope"):
        nums().filter(uc.C("nope") > 1).count()


def test_sql_query_run_and_registered_function(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files

    def length(file: uc.File) -> int:
        return len(file.read())

    uc.register("py_length", length)
    q = uc.query(f"SELECT file.path AS path, py_length(file) AS n FROM read_storage('{d}') ORDER BY path")
    rows = q.collect("path", "n")
    assert rows == [(k, len(v)) for k, v in sorted(data.items())]
    out = uc.run(f"SET prefetch = 2; CREATE DATASET lengths AS SELECT py_length(file) AS n FROM read_storage('{d}');"
                 "SELECT count(*) AS c FROM read_dataset('lengths');")
    assert isinstance(out[0], str) and isinstance(out[1], str)
    assert isinstance(out[2], pa.Table) and out[2].column("c").to_pylist() == [len(data)]
