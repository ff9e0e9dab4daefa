"""Lineage from Python: `uc.dataset_info` says what a saved version read
(storage URIs and dataset versions), as the catalog recorded it."""

import datetime

import pytest

import udfchain as uc

from conftest import make_files
from pathlib import Path


def test_dataset_info_lists_storage_and_dataset_sources(tmp_path: Path) -> None:
    d = tmp_path / "data"
    make_files(d, 4)
    raw = uc.read_storage(str(d)).save("raw")
    info = uc.dataset_info("raw")
    assert info["name"] == "raw" and info["version"] == 1 and info["rows"] == 4
    assert info["sources"] == [{"kind": "storage", "uri": f"file://{d}"}]
    assert isinstance(info["created"], datetime.datetime)
    assert info["created"].tzinfo is not None
    assert "file" in info["schema"]

    raw.filter(uc.C("file.size") > 1000).save("big")
    uc.read_storage(str(d)).save("raw")
    # "latest" is recorded as the version it meant; SQL scripts record too.
    uc.read_dataset("raw").union(uc.read_dataset("big")).save("both")
    assert uc.dataset_info("both")["sources"] == [
        {"kind": "dataset", "name": "raw", "version": 2},
        {"kind": "dataset", "name": "big", "version": 1},
    ]
    uc.run("CREATE DATASET q AS SELECT file.path FROM read_dataset('raw', 1)")
    assert uc.dataset_info("q")["sources"] == [{"kind": "dataset", "name": "raw", "version": 1}]
    assert uc.dataset_info("raw", version=1)["version"] == 1
    assert uc.dataset_info("raw")["versions"] == [1, 2]


def test_values_have_no_source_and_a_missing_dataset_raises() -> None:
    uc.read_values(n=[1, 2]).save("vals")
    assert uc.dataset_info("vals")["sources"] == []
    with pytest.raises(uc.UdfchainError, match="no dataset"):
        uc.dataset_info("nope")
    with pytest.raises(uc.UdfchainError, match="no version 9"):
        uc.dataset_info("vals", version=9)
