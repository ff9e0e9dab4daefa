"""Shared fixtures: a udfchain root per test and a directory of known files."""

import hashlib
import os

import pytest
from pathlib import Path


@pytest.fixture(autouse=True)
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Datasets, caches and temp dirs of each test under its own root."""
    r = tmp_path / "root"
    r.mkdir()
    monkeypatch.setenv("UDFCHAIN_ROOT", str(r))
    return r


def make_files(d: Path, n: int, size: int = 1000) -> dict[str, bytes]:
    """n files f000.bin.. whose bytes depend on their index; {name: bytes}."""
    d.mkdir(parents=True, exist_ok=True)
    out: dict[str, bytes] = {}
    for i in range(n):
        data = bytes((i * 7 + j) % 251 for j in range(size + i))
        (d / f"f{i:03}.bin").write_bytes(data)
        out[f"f{i:03}.bin"] = data
    return out


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    d = tmp_path / "data"
    return d, make_files(d, 12)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def temp_dirs(root: Path) -> list[str]:
    """The per-UDF temp dirs left under a root (none once a run has ended)."""
    t = root / "tmp"
    return sorted(os.listdir(t)) if t.exists() else []
