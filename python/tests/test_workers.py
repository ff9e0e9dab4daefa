"""Python UDFs in worker processes (`processes=N`): the same rows as
in-process, File reads through the parent, a worker's death as the row's
error under every on_error, tracebacks, refused lambdas, Ctrl-C."""

import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Iterator

import pytest

import udfchain as uc
from conftest import make_files, sha, temp_dirs
from pathlib import Path


# The UDFs are at module level: a worker imports them by module and name.


def spin(file: uc.File) -> str:
    """Pure-Python CPU work over the file's bytes."""
    h = 0
    for _ in range(20):
        for b in file.read():
            h = (h * 31 + b) % 1_000_003
    return f"{file.path}:{h}"


def where(file: uc.File) -> int:
    time.sleep(0.2)  # long enough that the two calls at once overlap
    return os.getpid()


def reads(file: uc.File) -> str:
    with file.open() as f:
        f.seek(2)
        head = f.read(3)
    return sha(file.read()) + head.hex()


def local(file: uc.File) -> str:
    with open(file.get_local_path(), "rb") as f:
        return sha(f.read())


def crash_on_f003(file: uc.File) -> int:
    if file.path == "f003.bin":
        os._exit(3)
    return file.size


def fail_on_f005(file: uc.File) -> int:
    if file.path == "f005.bin":
        raise ValueError(f"bad file {file.path}")
    return file.size


def chunks(file: uc.File) -> Iterator[int]:
    data = file.read()
    for i in range(0, len(data), 100):
        yield len(data[i : i + 100])


def lengths(file: list[uc.File]) -> list[int]:
    return [len(f.read()) for f in file]


def double(x: int) -> int:
    return 2 * x


def test_cpu_bound_udf_in_workers_returns_the_in_process_rows(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files
    c = uc.read_storage(str(d)).settings(prefetch=4).order_by("file.path")
    in_process = c.map(h=spin).collect("h")
    in_workers = c.settings(processes=2).map(h=spin).collect("h")
    assert in_workers == in_process
    assert len(in_workers) == len(data)


def test_calls_run_in_spawned_workers_at_most_n_at_once(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files
    uc.shutdown_workers()  # none left by other tests: this run starts its own
    pids = uc.read_storage(str(d)).settings(processes=2).map(pid=where).collect("pid")
    assert len(pids) == len(data)
    assert os.getpid() not in pids
    assert len(set(pids)) == 2  # two calls at once, each in its own worker
    assert set(pids) <= set(uc.worker_pids())


def test_file_methods_in_a_worker(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files
    want = {k: sha(v) + v[2:5].hex() for k, v in data.items()}
    for prefetch in (4, 0):  # a local copy, and reads served by the parent
        got = uc.read_storage(str(d)).settings(prefetch=prefetch, processes=2).map(r=reads).collect("file", "r")
        assert {f.path: r for f, r in got} == want
    got = uc.read_storage(str(d)).settings(prefetch=4, memory_file_limit=0, processes=2).map(p=local).collect("file", "p")
    assert {f.path: p for f, p in got} == {k: sha(v) for k, v in data.items()}


def test_values_gen_and_batch_map_in_workers(files: tuple[Path, dict[str, bytes]]) -> None:
    d, data = files
    assert uc.read_values(x=list(range(3000))).settings(processes=2).map(y=double).order_by("x").collect("y") == [
        2 * x for x in range(3000)
    ]
    c = uc.read_storage(str(d)).settings(processes=2)
    n = c.gen(n=chunks).collect("n")
    assert sum(n) == sum(len(v) for v in data.values())
    assert sorted(c.batch_map(n=lengths, batch_size=5).collect("n")) == sorted(len(v) for v in data.values())
    # A generator whose rows stop being wanted (limit) leaves its worker mid-call.
    assert len(c.gen(n=chunks).limit(3).collect("n")) == 3
    assert len(c.gen(n=chunks).collect("n")) == len(n)


def test_a_dead_worker_is_the_rows_error(files: tuple[Path, dict[str, bytes]], root: Path) -> None:
    d, data = files
    c = uc.read_storage(str(d)).settings(prefetch=4, processes=2)
    with pytest.raises(uc.UdfchainError) as e:
        c.settings(on_error="fail").map(n=crash_on_f003).collect()
    msg = str(e.value)
    assert "crash_on_f003" in msg and "f003.bin" in msg
    assert "worker process" in msg and "exited with code 3" in msg
    got = c.settings(on_error="skip").map(n=crash_on_f003).collect("file", "n")
    assert sorted(f.path for f, _ in got) == sorted(k for k in data if k != "f003.bin")
    by_file = dict(c.settings(on_error="null").map(n=crash_on_f003).collect("file", "n"))
    assert {f.path: n for f, n in by_file.items()}["f003.bin"] is None
    assert temp_dirs(root) == []


def test_exceptions_in_a_worker_keep_their_traceback(files: tuple[Path, dict[str, bytes]]) -> None:
    d, _ = files
    with pytest.raises(uc.UdfchainError) as e:
        uc.read_storage(str(d)).settings(processes=2).map(n=fail_on_f005).collect()
    msg = str(e.value)
    assert "f005.bin" in msg and "Traceback (most recent call last)" in msg
    assert "ValueError: bad file f005.bin" in msg and "in fail_on_f005" in msg


def test_functions_a_worker_cannot_import_are_refused(
    files: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    d, _ = files
    c = uc.read_storage(str(d)).settings(processes=2)

    def nested(file: uc.File) -> int:
        return 1

    # With cloudpickle they travel by value and run in the workers.
    if importlib.util.find_spec("cloudpickle") is not None:
        for fn in (nested, lambda file: 1):
            assert c.map(n=fn, output=int).count() == 12
    # Without it (as if not installed) they are refused when added.
    monkeypatch.setitem(sys.modules, "cloudpickle", None)
    for fn in (nested, lambda file: 1):
        with pytest.raises(TypeError, match="cannot run in worker processes"):
            c.map(n=fn, output=int)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="processes must be"):
        c.settings(processes=-1)
    # In-process, the same function runs.
    assert c.settings(processes=False).map(n=nested).count() == 12


SCRIPT = textwrap.dedent(
    """
    import os, sys
    import udfchain as uc

    def burn(file: uc.File) -> int:
        print("call", os.getpid(), flush=True)
        n = 0
        for i in range(30_000_000):  # seconds of pure-Python work
            n += i
        return n

    if __name__ == "__main__":
        try:
            uc.read_storage(sys.argv[1]).settings(prefetch=4, processes=2, memory_file_limit=0).map(n=burn).collect()
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    """
)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return True


def test_ctrl_c_stops_workers_and_removes_temp_dirs(tmp_path: Path, root: Path) -> None:
    d = tmp_path / "many"
    make_files(d, 20, size=100)
    script = tmp_path / "burn.py"
    script.write_text(SCRIPT)
    p = subprocess.Popen(
        [sys.executable, str(script), str(d)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "UDFCHAIN_ROOT": str(root)},
    )
    pids = set()
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("call"):
            pids.add(int(line.split()[1]))
            if len(pids) == 2:
                break
    start = time.monotonic()
    p.send_signal(signal.SIGINT)  # the parent only: it stops its workers
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    assert "interrupted" in out and "finished" not in out
    assert time.monotonic() - start < 10
    assert temp_dirs(root) == []
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids), pids


def heavy_modules(file: uc.File) -> str:
    return ",".join(m for m in ("pyarrow", "numpy") if m in sys.modules) or "none"


def test_a_worker_given_plain_values_starts_without_pyarrow(files: tuple[Path, dict[str, bytes]]) -> None:
    """Plain rows and values cross the pipe pickled: a worker never imports
    pyarrow (nor numpy with it), so it starts in a fraction of the time."""
    d, data = files
    uc.shutdown_workers()  # fresh workers: none has run an IPC call before
    got = uc.read_storage(str(d)).settings(processes=2).map(m=heavy_modules).collect("m")
    assert got == ["none"] * len(data)
    code = "import sys, udfchain; print('pyarrow' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
