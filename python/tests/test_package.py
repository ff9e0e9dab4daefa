"""The package as a user sees it: its public names, type information,
`repr(chain)`, `udfchain.functions`, and exceptions caught by kind."""

from __future__ import annotations

import importlib.resources
import inspect
import sys
from pathlib import Path

import pytest

import udfchain as uc
from udfchain import functions as F

from conftest import make_files


def test_all_is_the_public_api() -> None:
    assert sorted(uc.__all__) == sorted(set(uc.__all__))
    for name in uc.__all__:
        assert hasattr(uc, name), name
        assert not name.startswith("_")
    for private in ("udf_invoker", "udf_parts", "processes_of", "schema_ipc", "expr", "pa", "output_type"):
        assert private not in uc.__all__
        assert not hasattr(uc, private), private


def test_every_public_name_has_a_docstring() -> None:
    def documented(obj: object, where: str) -> None:
        assert inspect.getdoc(obj), f"{where} has no docstring"

    for name in uc.__all__:
        obj = getattr(uc, name)
        if name == "func":
            assert obj is uc.functions
            continue
        documented(obj, name)
        if inspect.isclass(obj) and obj.__module__.startswith("udfchain"):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not callable(member) and not isinstance(member, property):
                    continue
                documented(member, f"{name}.{attr}")
    for name in F.__all__:
        documented(getattr(F, name), f"functions.{name}")


def test_typed_package() -> None:
    root = importlib.resources.files("udfchain")
    assert root.joinpath("py.typed").is_file()
    assert root.joinpath("_internal.pyi").is_file()
    # `settings(**kw)` is typed keyword arguments (a TypedDict), each optional.
    assert "prefetch" in uc.Settings.__optional_keys__ and "processes" in uc.Settings.__optional_keys__
    assert not uc.Settings.__required_keys__


def test_functions_module_and_func_alias() -> None:
    assert uc.func is uc.functions is sys.modules["udfchain.functions"]
    c = uc.read_values(k=["x", "y", "x"], v=[1, 2, 3])
    g = c.group_by(partition_by="k", n=F.count(), total=F.sum("v"), hi=F.max("v")).order_by("k")
    assert g.collect("k", "n", "total", "hi") == [("x", 2, 4, 3), ("y", 1, 2, 2)]
    assert c.group_by(a=uc.func.avg("v"), lo=uc.func.min("v")).collect("a", "lo") == [(2.0, 1)]


def test_repr_shows_the_steps(tmp_path: Path) -> None:
    def size(file: uc.File) -> int:
        return file.size

    c = (
        uc.read_storage(str(tmp_path), glob="*.bin")
        .settings(prefetch=4, cache=False)
        .filter(uc.C("file.size") > 0)
        .map(n=size)
        .order_by("n", descending=True)
        .limit(3)
    )
    assert repr(c) == "\n".join(
        [
            f"Chain(read_storage({str(tmp_path)!r}, glob='*.bin')",
            "  .settings(prefetch=4, cache=False)",
            f"  .filter({uc.C('file.size') > 0!r})",
            "  .map(n=size)",
            "  .order_by('n', descending=True)",
            "  .limit(3))",
        ]
    )
    assert repr(uc.query("SELECT 1 AS x")) == "Chain(query('SELECT 1 AS x'))"


def test_errors_by_kind(tmp_path: Path) -> None:
    kinds = (uc.UdfError, uc.StorageError, uc.DatasetNotFound, uc.SettingError)
    for kind in kinds:
        assert issubclass(kind, uc.UdfchainError) and kind.__module__ == "udfchain"
    assert uc.UdfchainError.__module__ == "udfchain"
    # SettingError is also the ValueError that processes= raised.
    assert issubclass(uc.SettingError, ValueError)

    with pytest.raises(uc.SettingError, match="did you mean prefetch"):
        uc.read_values(x=[1]).settings(prefech=4)  # type: ignore[call-arg]
    with pytest.raises(uc.SettingError, match="fail, skip or null"):
        uc.read_values(x=[1]).settings(on_error="retry")  # type: ignore[arg-type]
    with pytest.raises(uc.SettingError, match="processes must be"):
        uc.read_values(x=[1]).settings(processes=-1)
    with pytest.raises(ValueError, match="processes must be"):
        uc.read_values(x=[1]).settings(processes=-1)

    with pytest.raises(uc.DatasetNotFound, match="no dataset"):
        uc.read_dataset("nope").count()
    uc.read_values(x=[1]).save("there")
    with pytest.raises(uc.DatasetNotFound, match="no version 7"):
        uc.read_dataset("there", 7).count()
    with pytest.raises(uc.DatasetNotFound):
        uc.dataset_info("nope")
    with pytest.raises(uc.DatasetNotFound):
        uc.run("SELECT * FROM read_dataset('nope')")

    with pytest.raises(uc.StorageError, match="missing"):
        uc.read_storage(str(tmp_path / "missing") + "/").count()
    with pytest.raises(uc.StorageError):
        uc.read_parquet(str(tmp_path / "missing.parquet")).count()

    make_files(tmp_path / "d", 3)

    def boom(file: uc.File) -> int:
        raise RuntimeError(f"boom on {file.name}")

    with pytest.raises(uc.UdfError, match=r"(?s)UDF boom failed on .*f000.bin.*boom on f000.bin") as e:
        uc.read_storage(str(tmp_path / "d")).order_by("file.path").map(n=boom).collect()
    assert "Traceback" in str(e.value)

    raised: list[BaseException] = []

    def file_gone(file: uc.File) -> int:
        (tmp_path / "e" / file.path).unlink()
        try:
            return len(file.read())
        except Exception as e:
            raised.append(e)
            raise

    # A read inside a UDF that fails raises StorageError there; the run's error is the UDF's.
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "a.bin").write_bytes(b"abc")
    chain = uc.read_storage(str(tmp_path / "e")).settings(prefetch=0).map(n=file_gone)
    with pytest.raises(uc.UdfError, match="StorageError"):
        chain.collect()
    assert len(raised) == 1 and isinstance(raised[0], uc.StorageError), raised

    # Anything else stays the base class.
    with pytest.raises(uc.UdfchainError) as other:
        uc.read_values(x=[1]).filter(uc.C("nope") > 1).count()
    assert not isinstance(other.value, kinds)
