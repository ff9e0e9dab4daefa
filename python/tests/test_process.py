"""Ctrl-C of a running chain (a real subprocess sent SIGINT) and fork()."""

import os
import signal
import subprocess
import sys
import textwrap

from conftest import make_files, temp_dirs
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import udfchain as uc

    def slow(file: uc.File) -> int:
        print("call", flush=True)
        time.sleep(0.05)
        return len(file.read())

    try:
        uc.read_storage(sys.argv[1]).settings(prefetch=4, parallel=2, memory_file_limit=0).map(n=slow).collect()
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    """
)


def test_ctrl_c_stops_a_run_and_removes_temp_dirs(tmp_path: Path, root: Path) -> None:
    d = tmp_path / "many"
    make_files(d, 400, size=100)
    p = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(d)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "UDFCHAIN_ROOT": str(root)},
    )
    # Wait for the UDF to run, then Ctrl-C.
    assert p.stdout is not None
    for line in p.stdout:
        if line.strip() == "call":
            break
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    lines = out.split()
    assert p.returncode == 130, (out, err)
    assert "interrupted" in lines and "finished" not in lines
    # 400 calls of 50 ms at 2 at once take 10 s; Ctrl-C stopped it well before.
    assert lines.count("call") < 300
    assert temp_dirs(root) == []


FORK = textwrap.dedent(
    """
    import os, sys
    import udfchain as uc

    if sys.argv[1] == "started":
        assert uc.read_values(x=[1]).count() == 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            msg = f"ok {uc.read_values(x=[1, 2, 3]).count()}"
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        print(f.read())
    os.waitpid(pid, 0)
    print("parent", uc.read_values(x=[1, 2]).count())
    """
)


def fork(mode: str) -> list[str]:
    # A hang would end at the timeout (and fail the test), never block the suite.
    p = subprocess.run([sys.executable, "-W", "ignore", "-c", FORK, mode], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_fork_after_the_engine_started_fails_at_once() -> None:
    child, parent = fork("started")
    assert child.startswith("RuntimeError") and "forked from process" in child and "spawn" in child
    assert parent == "parent 2"


def test_fork_before_the_engine_started_works() -> None:
    assert fork("imported") == ["ok 3", "parent 2"]
