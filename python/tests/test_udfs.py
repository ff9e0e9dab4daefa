"""Python UDFs inside the engine: every kind, every File method, a local
file's own path, every on_error policy (a remote copy's lifetime: test_s3)."""

import os
from typing import Iterator

import pytest

import udfchain as uc
from conftest import sha, temp_dirs
from pathlib import Path


def test_map_reads_every_file(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files

    def digest(file: uc.File) -> str:
        return sha(file.read())

    rows = uc.read_storage(str(d)).settings(prefetch=4, parallel=3).map(digest=digest).collect("file", "digest")
    assert {f.path: h for f, h in rows} == {k: sha(v) for k, v in data.items()}
    assert all(isinstance(f, uc.File) and f.size == len(data[f.path]) for f, _ in rows)


def test_map_without_prefetch_reads_the_store(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files

    def first_bytes(file: uc.File) -> bytes:
        with file.open() as f:  # no local copy: ranged reads
            f.seek(3)
            head = f.read(5)
            f.seek(-2, os.SEEK_END)
            return head + f.read()

    got = dict(uc.read_storage(str(d)).settings(prefetch=0).map(b=first_bytes).collect("file", "b"))
    assert {f.path: b for f, b in got.items()} == {k: v[3:8] + v[-2:] for k, v in data.items()}


def test_file_methods_and_a_local_files_own_path(files: tuple[Path, dict[str, bytes]], root: Path) -> None:
    d, data = files
    seen = {}

    def probe(file: uc.File) -> str:
        path = file.get_local_path()
        assert os.path.exists(path)
        with open(path, "rb") as f:
            assert f.read() == data[file.path]
        with file.open() as f:
            assert f.seekable()
            f.seek(10)
            assert f.read(4) == data[file.path][10:14]
        assert file.read_text(encoding="latin-1") == data[file.path].decode("latin-1")
        assert file.etag is None or isinstance(file.etag, str)
        assert file.source.startswith("file://") and file.name == file.path
        seen[file.path] = path
        return path

    # A local directory's file is its own path, whatever holds it ahead (memory,
    # or the temp dir at memory_file_limit=0): never copied, never deleted.
    cases: list[uc.Settings] = [
        {"prefetch": 3, "memory_file_limit": 0, "cache": False},
        {"prefetch": 3, "cache": False},
        {"prefetch": 0, "cache": False},
    ]
    for settings in cases:
        seen.clear()
        c = uc.read_storage(str(d)).settings(**settings).map(p=probe)
        assert c.count() == len(data)
        assert seen == {k: str(d / k) for k in data}, settings
        assert all((d / k).read_bytes() == v for k, v in data.items())
        assert temp_dirs(root) == []


def test_file_outside_a_call_does_not_read(files: tuple[Path, dict[str, bytes]]) -> None:
    d, _ = files
    f = uc.read_storage(str(d)).limit(1).collect("file")[0]
    with pytest.raises(RuntimeError, match="inside a UDF"):
        f.read()


def test_gen_batch_map_agg(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files

    def chunks(file: uc.File) -> Iterator[int]:
        b = file.read()
        for i in range(0, len(b), 400):
            yield len(b[i : i + 400])

    got = uc.read_storage(str(d)).settings(batch_size=2).gen(part=chunks).collect("file", "part")
    want = sorted((k, min(400, len(v) - i)) for k, v in data.items() for i in range(0, len(v), 400))
    assert sorted((f.path, p) for f, p in got) == want

    calls = []

    def sizes(file: list[uc.File]) -> list[int]:
        calls.append(len(file))
        return [len(f.read()) for f in file]

    got = uc.read_storage(str(d)).batch_map(n=sizes, batch_size=5).collect("file", "n")
    assert {f.path: n for f, n in got} == {k: len(v) for k, v in data.items()}
    assert max(calls) <= 5 and sum(calls) == len(data)

    def total(file: list[uc.File]) -> Iterator[int]:
        yield sum(len(f.read()) for f in file)

    g = (
        uc.read_storage(str(d))
        .mutate(group=uc.C("file.size") % 2)
        .agg(total=total, partition_by="group")
        .order_by("group")
        .collect("group", "total")
    )
    totals: dict[int, int] = {}
    for v in data.values():
        totals[len(v) % 2] = totals.get(len(v) % 2, 0) + len(v)
    assert g == sorted(totals.items())


def test_values_udf_params_by_name() -> None:
    def label(num: int, name: str) -> str:
        return f"{name}{num}"

    c = uc.read_values(num=[1, 2], name=["a", "b"]).map(label=label)
    assert sorted(c.collect("label")) == ["a1", "b2"]


def failing(file: uc.File) -> int:
    if file.path == "f003.bin":
        raise ValueError("bad file " + file.path)
    return file.size


def test_on_error_fail_names_udf_file_row_and_traceback(files: tuple[Path, dict[str, bytes]]) -> None:
    d, _ = files
    with pytest.raises(uc.UdfchainError) as e:
        uc.read_storage(str(d)).order_by("file.path").map(n=failing).collect()
    msg = str(e.value)
    assert "UDF failing failed" in msg and "f003.bin" in msg and "(row " in msg
    assert "Traceback" in msg and "ValueError: bad file f003.bin" in msg and "in failing" in msg


def test_on_error_skip_and_null(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files
    skip = uc.read_storage(str(d)).settings(on_error="skip").map(n=failing).collect("file", "n")
    assert sorted(f.path for f, _ in skip) == sorted(k for k in data if k != "f003.bin")
    null = dict((f.path, n) for f, n in uc.read_storage(str(d)).settings(on_error="null").map(n=failing).collect("file", "n"))
    assert null["f003.bin"] is None and null["f000.bin"] == len(data["f000.bin"])
    assert len(null) == len(data)


def test_gen_error_follows_on_error(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files

    def boom(file: uc.File) -> Iterator[int]:
        yield 1
        if file.path == "f001.bin":
            raise RuntimeError("mid-stream")
        yield 2

    with pytest.raises(uc.UdfchainError, match="mid-stream"):
        uc.read_storage(str(d)).gen(x=boom).collect()
    rows = uc.read_storage(str(d)).settings(on_error="skip").gen(x=boom).collect("file", "x")
    assert {f.path for f, _ in rows} >= set(data) - {"f001.bin"}


def test_batch_map_wrong_length() -> None:
    def short(num: list[int]) -> list[int]:
        return num[:-1]

    with pytest.raises(uc.UdfchainError, match="returned 2 values for 3 rows"):
        uc.read_values(num=[1, 2, 3]).batch_map(x=short, batch_size=3).collect()
