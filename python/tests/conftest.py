"""Shared fixtures: a udfchain root per test and a directory of known files."""

import hashlib
import os

import pytest


@pytest.fixture(autouse=True)
def root(tmp_path, monkeypatch):
    """Datasets, caches and temp dirs of each test under its own root."""
    r = tmp_path / "root"
    r.mkdir()
    monkeypatch.setenv("UDFCHAIN_ROOT", str(r))
    return r


def make_files(d, n, size=1000):
    """n files f000.bin.. whose bytes depend on their index; {name: bytes}."""
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for i in range(n):
        data = bytes((i * 7 + j) % 251 for j in range(size + i))
        (d / f"f{i:03}.bin").write_bytes(data)
        out[f"f{i:03}.bin"] = data
    return out


@pytest.fixture
def files(tmp_path):
    d = tmp_path / "data"
    return d, make_files(d, 12)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def temp_dirs(root):
    """The per-UDF temp dirs left under a root (none once a run has ended)."""
    t = root / "tmp"
    return sorted(os.listdir(t)) if t.exists() else []
