"""Exceptions a user catches by kind: every engine error is a
`udfchain.UdfchainError`, its kind a subclass."""

from __future__ import annotations

from pathlib import Path

import pytest

import udfchain as uc

from conftest import make_files


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
