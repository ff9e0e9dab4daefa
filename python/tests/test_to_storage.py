"""`Chain.to_storage` from Python (DataChain's names): every placement to a
local dir, a collision error, a rerun that writes nothing, symlinks, and a
Python process killed with SIGKILL mid-export."""

import hashlib
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

import udfchain as uc

from conftest import make_files
from pathlib import Path


def tree(d: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for base, _, names in os.walk(d):
        for n in names:
            p = os.path.join(base, n)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def test_placements_write_every_file_byte_for_byte(files: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    d, want = files
    chain = uc.read_storage(str(d))
    assert chain.to_storage(str(tmp_path / "full")) is None  # type: ignore[func-returns-value]
    assert tree(tmp_path / "full") == want
    chain.to_storage(str(tmp_path / "name"), placement="filename")
    assert tree(tmp_path / "name") == want
    # DataChain 0.62's other parameters are taken: filepath (local files as
    # fullpath), num_threads, anon and client_config.
    chain.to_storage(str(tmp_path / "path"), placement="filepath", num_threads=2, anon=False, client_config={})
    assert tree(tmp_path / "path") == want
    chain.to_storage(str(tmp_path / "sum"), signal="file", placement="checksum")
    assert tree(tmp_path / "sum") == {hashlib.sha256(b).hexdigest() + ".bin": b for b in want.values()}
    chain.to_storage(str(tmp_path / "etag"), placement="etag")
    etags = chain.to_values("file.etag")
    assert sorted(tree(tmp_path / "etag")) == sorted(f"{e}.bin" for e in etags)
    with pytest.raises(uc.UdfchainError, match="unknown placement"):
        chain.to_storage(str(tmp_path / "x"), placement="nowhere")  # type: ignore[arg-type]


def test_a_rerun_writes_nothing_and_logs_the_counts(files: tuple[Path, dict[str, bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d, want = files
    chain = uc.read_storage(str(d))
    with caplog.at_level(logging.INFO, logger="udfchain"):
        chain.to_storage(str(tmp_path / "out"))
        chain.to_storage(str(tmp_path / "out"))
    msgs = [r.getMessage() for r in caplog.records]
    assert any("12 file(s) written, 0 skipped" in m for m in msgs), msgs
    assert any("0 file(s) written, 12 skipped" in m for m in msgs), msgs


def test_a_filename_collision_is_an_error_naming_both(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / "src" / sub).mkdir(parents=True)
        (tmp_path / "src" / sub / "same.txt").write_text(sub)
    with pytest.raises(uc.UdfchainError) as e:
        uc.read_storage(str(tmp_path / "src")).to_storage(str(tmp_path / "out"), placement="filename")
    assert "a/same.txt" in str(e.value) and "b/same.txt" in str(e.value)
    assert not (tmp_path / "out").exists() or tree(tmp_path / "out") == {}


def test_symlinks(files: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    d, want = files
    uc.read_storage(str(d)).to_storage(str(tmp_path / "links"), link_type="symlink")
    for name in want:
        assert os.readlink(tmp_path / "links" / name) == str(d / name)
    assert tree(tmp_path / "links") == want


def test_a_killed_python_export_leaves_no_partial_file_and_a_rerun_completes(tmp_path: Path, root: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    want = {}
    for i in range(150):
        b = bytes((i * 13 + j) % 256 for j in range(256)) * 1600
        (src / f"f{i:03}.bin").write_bytes(b)
        want[f"f{i:03}.bin"] = b
    out = tmp_path / "out"
    script = f"import udfchain as uc; uc.read_storage({str(src)!r}).to_storage({str(out)!r}, placement='filename')"
    env = dict(os.environ, UDFCHAIN_ROOT=str(root))
    child = subprocess.Popen([sys.executable, "-c", script], env=env)

    def finals() -> list[str]:
        if not out.exists():
            return []
        return [n for n in os.listdir(out) if not n.startswith(".udfchain-part-")]

    deadline = time.time() + 120
    try:
        while len(finals()) < 2:
            assert time.time() < deadline, "no file exported in 120 s"
            assert child.poll() is None, "the export ended early"
            time.sleep(0.005)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    got = tree(out)
    done = {k: v for k, v in got.items() if not k.startswith(".udfchain-part-")}
    assert len(done) < len(want), "killed after the end"
    for k, v in done.items():
        assert v == want[k], f"{k} is partial under its final name"
    uc.read_storage(str(src)).to_storage(str(out), placement="filename")
    assert tree(out) == want, "complete, and no temp file left"
