"""Resumable saves from Python: a save that failed or was killed midway, run
again, calls its UDF only for the rows its checkpoint did not keep; a new
`version=` starts over. Through the real engine (its checkpoints under the
test's root), with a real child process killed by SIGKILL."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator, TypedDict

import pytest

import udfchain as uc

N = 1200  # more than two chunks of kept results (512 rows each)

class State(TypedDict):
    calls: int
    fail_on: str | None


STATE: State = {"calls": 0, "fail_on": None}


def doubled(file: uc.File) -> int:
    """The number in the file, twice; raises on the file named by STATE."""
    STATE["calls"] += 1
    if file.name == STATE["fail_on"]:
        raise ValueError(f"{file.name} is broken")
    return 2 * int(file.read_text())


def numbered(d: Path, n: int = N) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"f{i:04}.txt").write_text(str(i))
    return d


def chain(d: Path, version: str | int | None = None) -> uc.Chain:
    return uc.read_storage(str(d)).order_by("file.path").map(twice=doubled, version=version)


def save(c: uc.Chain, name: str, fail_on: str | None = None) -> uc.Chain:
    STATE["calls"], STATE["fail_on"] = 0, fail_on
    return c.save(name)


def checkpoints(root: Path) -> list[str]:
    d = root / "checkpoints"
    return sorted(os.listdir(d)) if d.exists() else []


def want(n: int = N) -> list[int]:
    return [2 * i for i in range(n)]


def test_a_failed_save_run_again_calls_only_the_rows_not_kept(tmp_path: Path, root: Path) -> None:
    d = numbered(tmp_path / "data")
    with pytest.raises(Exception, match="f0900.txt is broken"):
        save(chain(d), "twice", fail_on="f0900.txt")
    assert checkpoints(root), "a failed save keeps its checkpoint"

    out = save(chain(d), "twice")
    assert 0 < STATE["calls"] <= N - 512, f"resumed: {STATE['calls']} calls of {N}"
    assert out.order_by("file.path").collect("twice") == want()
    assert checkpoints(root) == [], "a save that commits removes its checkpoint"


def test_a_new_version_starts_over_and_the_same_version_resumes(tmp_path: Path, root: Path) -> None:
    d = numbered(tmp_path / "data")
    with pytest.raises(Exception, match="is broken"):
        save(chain(d, version="1"), "v", fail_on="f0900.txt")
    assert "version=1" in chain(d, version="1").explain()

    save(chain(d, version="2"), "v")
    assert STATE["calls"] == N, "version 2 reuses nothing of version 1"

    with pytest.raises(Exception, match="is broken"):
        save(chain(d, version=3), "v", fail_on="f0900.txt")
    out = save(chain(d, version="3"), "v")
    assert STATE["calls"] <= N - 512, "the same version (3 and '3') resumes"
    assert out.order_by("file.path").collect("twice") == want()


def test_version_on_every_kind_and_what_it_accepts(tmp_path: Path) -> None:
    c = uc.read_values(k=["a", "b", "a"], x=[1, 2, 3])

    def plus(x: int) -> int:
        return x + 1

    def twice(x: int) -> Iterator[int]:
        yield x
        yield x

    def total(x: list[int]) -> list[int]:
        return [sum(x)]

    def doubles(x: list[int]) -> list[int]:
        return [2 * v for v in x]

    for step in (
        c.map(y=plus, version="2"),
        c.gen(y=twice, version="2"),
        c.batch_map(y=doubles, version="2"),
        c.agg(y=total, params="x", partition_by="k", version="2"),
    ):
        assert "version=2" in step.explain()
    assert "version" not in c.map(y=plus).explain()
    bads: tuple[Any, ...] = ("", 1.5, True, ["2"])
    for bad in bads:
        with pytest.raises(TypeError, match="version must be"):
            c.map(y=plus, version=bad)


KILLED = """
import os, signal, sys
import udfchain as uc
from pathlib import Path

calls = 0

def doubled(file: uc.File) -> int:
    global calls
    calls += 1
    if calls == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
    return 2 * int(file.read_text())

if __name__ == "__main__":
    uc.read_storage(sys.argv[1]).order_by("file.path").map(twice=doubled).save("twice")
"""


def test_a_save_killed_midway_run_again_calls_only_the_rows_not_kept(tmp_path: Path, root: Path) -> None:
    d = numbered(tmp_path / "data")
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED))
    p = subprocess.run([sys.executable, str(script), str(d), "1100"], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert checkpoints(root), "the killed save left its checkpoint"

    # The same UDF (its name is the key, not its module) in this process.
    out = save(chain(d), "twice")
    assert 0 < STATE["calls"] <= N - 512, f"resumed: {STATE['calls']} calls of {N}"
    assert out.order_by("file.path").collect("twice") == want()
