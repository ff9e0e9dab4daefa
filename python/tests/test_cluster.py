"""Python chains on a Ballista cluster of real processes on 127.0.0.1: a
scheduler (`udfchain cluster scheduler`, or `python -m udfchain cluster
scheduler`) and Python executors (`python -m udfchain cluster executor`).
The same rows as the local run for every UDF kind, a module function, a
lambda (cloudpickle), a class UDF set up once per executor, saves and the
loader; failures said, not waited on: a missing module, a version mismatch,
an executor killed mid-query, Ctrl-C, no executor."""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import udfchain as uc
import cluster_udfs as cu
from conftest import make_files

TESTS = Path(__file__).resolve().parent
BIN = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache/udfchain-target")) / "debug" / "udfchain"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Cluster:
    """A scheduler and `n` Python executors of `slots` slots each, as
    processes; their logs and the UDFs' logs under `dir`."""

    def __init__(self, dir: Path, n: int = 2, slots: int = 1, rust_scheduler: bool = True) -> None:
        self.dir = dir
        dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"df://127.0.0.1:{self.port}"
        self.setup_log = dir / "setups.log"
        self.call_log = dir / "calls.log"
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "UDFCHAIN_TEST_SETUP_LOG": str(self.setup_log),
            "UDFCHAIN_TEST_CALL_LOG": str(self.call_log),
            "AWS_METADATA_ENDPOINT": "http://127.0.0.1:1",
        }
        bind = f"127.0.0.1:{self.port}"
        if rust_scheduler and BIN.exists():
            cmd = [str(BIN), "cluster", "scheduler", "--bind", bind]
        else:
            cmd = [sys.executable, "-m", "udfchain", "cluster", "scheduler", "--bind", bind]
        self.scheduler = self._spawn(cmd, "scheduler")
        deadline = time.monotonic() + 30
        while not answers(self.port):
            assert time.monotonic() < deadline, "the scheduler did not start: " + self.log("scheduler")
            time.sleep(0.1)
        self.executors = [self.executor(i, slots) for i in range(n)]
        if n:
            self.wait_ready(n)

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "wb")
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def log(self, name: str) -> str:
        p = self.dir / f"{name}.log"
        return p.read_text(errors="replace")[-3000:] if p.exists() else ""

    def executor(self, i: int, slots: int) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable, "-m", "udfchain", "cluster", "executor",
            "--scheduler", f"127.0.0.1:{self.port}",
            "--slots", str(slots),
            "--work-dir", str(self.dir / f"e{i}"),
        ]  # fmt: skip
        return self._spawn(cmd, f"executor{i}")

    def wait_ready(self, n: int) -> None:
        """Until a chain's UDF calls run in `n` executor processes."""
        data = self.dir / "probe"
        make_files(data, 4 * n, 10)
        deadline = time.monotonic() + 90
        while True:
            pids = set(
                uc.read_storage(str(data))
                .settings(cluster=self.url, workers=n)
                .map(pid=cu.pid_of)
                .collect("pid")
            )
            if len(pids) >= n:
                assert os.getpid() not in pids
                return
            assert time.monotonic() < deadline, f"{len(pids)} of {n} executors ran calls: " + self.log("executor0")
            time.sleep(0.5)

    def setups(self) -> list[int]:
        return [int(x) for x in self.setup_log.read_text().split()] if self.setup_log.exists() else []

    def calls(self) -> int:
        return len(self.call_log.read_text().splitlines()) if self.call_log.exists() else 0

    def stop(self) -> None:
        for p in [*self.executors, self.scheduler]:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    make_files(d, 24, 300)
    return d


def rows(chain: uc.Chain, *cols: str) -> list[tuple[Any, ...]]:
    return sorted(chain.to_list(*cols))


def test_every_kind_gives_the_local_rows(cluster: Cluster, data: Path) -> None:
    base = uc.read_storage(str(data))
    chains: dict[str, tuple[Callable[[uc.Chain], uc.Chain], tuple[str, ...]]] = {
        "map": (lambda c: c.map(size=cu.size_of), ("file.path", "size")),
        "gen": (lambda c: c.gen(half=cu.halves), ("half",)),
        "batch_map": (lambda c: c.settings(batch_size=5).batch_map(first=cu.firsts), ("file.path", "first")),
        "lambda": (lambda c: c.map(size=cu.size_of).map(double=lambda size: size * 2, output=int), ("file.path", "double")),
        "agg": (lambda c: c.map(size=cu.size_of).agg(total=cu.total, partition_by="size"), ("size", "total")),
        "agg_all": (lambda c: c.map(size=cu.size_of).agg(total=cu.total), ("total",)),
    }
    for kind, (build, cols) in chains.items():
        local = rows(build(base), *cols)
        remote = rows(build(base.settings(cluster=cluster.url, workers=2)), *cols)
        assert remote == local, kind
        assert local, kind


def test_udfs_run_in_the_executor_processes(cluster: Cluster, data: Path) -> None:
    pids = set(uc.read_storage(str(data)).settings(cluster=cluster.url, workers=2).map(pid=cu.pid_of).collect("pid"))
    # Which executor takes which task is the scheduler's choice.
    assert pids and pids <= {p.pid for p in cluster.executors}, pids


def test_a_class_udf_sets_up_once_per_executor_process(cluster: Cluster, data: Path) -> None:
    before = cluster.setups()
    chain = uc.read_storage(str(data)).settings(cluster=cluster.url, workers=2).map(tag=cu.Tagger("t"))
    for _ in range(3):
        tags = sorted(chain.collect("tag"))
        assert tags == sorted(f"t:{p.name}" for p in data.iterdir())
    new = cluster.setups()[len(before):]
    # Three runs of two tasks each: at most one setup in each executor process.
    assert new and len(new) == len(set(new)), new
    assert set(new) <= {p.pid for p in cluster.executors}, new


def test_processes_run_the_udf_in_worker_processes_of_the_executors(cluster: Cluster, data: Path) -> None:
    before = cluster.setups()
    chain = uc.read_storage(str(data)).settings(cluster=cluster.url, processes=2).map(tag=cu.Tagger("w"))
    assert sorted(chain.collect("tag")) == sorted(f"w:{p.name}" for p in data.iterdir())
    new = cluster.setups()[len(before):]
    # Set up once in each worker process that got a call: not in the
    # executors themselves, nor here.
    assert new and len(new) == len(set(new)), new
    assert not set(new) & {os.getpid(), *(p.pid for p in cluster.executors)}, new


def test_a_lambda_and_a_setup_value_travel_by_value(cluster: Cluster, data: Path) -> None:
    offset = 1000
    chain = (
        uc.read_storage(str(data))
        .settings(cluster=cluster.url)
        .setup(base=lambda: offset)
        .map(n=lambda file, base: base + file.size, output=int)
    )
    assert sorted(chain.collect("n")) == sorted(offset + p.stat().st_size for p in data.iterdir())


def test_save_commits_on_the_client_and_reads_back_locally(cluster: Cluster, data: Path, root: Path) -> None:
    name, version, n = "sizes", 1, 24
    saved = uc.read_storage(str(data)).settings(cluster=cluster.url, workers=2).map(size=cu.size_of).save(name)
    assert saved is not None
    info = uc.dataset_info(name)
    assert (info["version"], info["rows"]) == (version, n)
    back = rows(uc.read_dataset(name), "file.path", "size")
    assert back == rows(uc.read_storage(str(data)).map(size=cu.size_of), "file.path", "size")
    # The loader reads a chain that runs on the cluster too.
    loader = uc.read_storage(str(data)).settings(cluster=cluster.url).map(size=cu.size_of).to_pytorch(batch_size=8)
    seen = sum(len(b["size"]) for b in loader)
    assert seen == n


def test_connect_runs_every_chain_there_until_connect_none(cluster: Cluster, data: Path) -> None:
    uc.connect(cluster.url, workers=2)
    try:
        pids = set(uc.read_storage(str(data)).map(pid=cu.pid_of).collect("pid"))
        assert pids and pids <= {p.pid for p in cluster.executors}, pids
        here = set(uc.read_storage(str(data)).settings(cluster="local").map(pid=cu.pid_of).collect("pid"))
        assert here == {os.getpid()}
    finally:
        uc.connect(None)
    assert set(uc.read_storage(str(data)).map(pid=cu.pid_of).collect("pid")) == {os.getpid()}


def test_connect_to_no_scheduler_says_so_at_once(tmp_path: Path) -> None:
    t = time.monotonic()
    with pytest.raises(uc.UdfchainError, match=r"127\.0\.0\.1:1"):
        uc.connect("df://127.0.0.1:1")
    assert time.monotonic() - t < 30


def test_a_module_the_executor_cannot_import_fails_the_query_naming_it(
    cluster: Cluster, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mods = tmp_path / "client_only"
    mods.mkdir()
    (mods / "client_only_udfs.py").write_text("def n(file):\n    return 1\n")
    monkeypatch.syspath_prepend(str(mods))
    client_only_udfs = importlib.import_module("client_only_udfs")

    t = time.monotonic()
    with pytest.raises(uc.UdfchainError) as e:
        uc.read_storage(str(data)).settings(cluster=cluster.url).map(n=client_only_udfs.n, output=int).collect()
    text = str(e.value)
    assert "client_only_udfs" in text and "ModuleNotFoundError" in text, text
    assert "UDF n is not available on executor" in text, text
    assert time.monotonic() - t < 60


def test_a_version_mismatch_is_refused_naming_both(
    cluster: Cluster, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from udfchain import _ship

    chain = uc.read_storage(str(data)).settings(cluster=cluster.url)
    monkeypatch.setattr(_ship, "VERSION", "0.0.1-other")
    with pytest.raises(uc.UdfchainError) as e:
        chain.map(size=cu.size_of).collect()
    assert f"the client runs udfchain 0.0.1-other and this executor udfchain {uc.__version__}" in str(e.value)
    monkeypatch.undo()
    monkeypatch.setattr(_ship, "PYTHON", "2.7")
    with pytest.raises(uc.UdfchainError) as e:
        chain.map(size=cu.size_of).collect()
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"pickled by Python 2.7 on the client and this executor runs Python {mine}" in str(e.value)


def test_a_udf_that_does_not_pickle_is_refused_on_the_client(cluster: Cluster, data: Path) -> None:
    import threading

    lock = threading.Lock()

    class Holder(uc.Mapper):
        def __init__(self) -> None:
            self.lock = lock

        def process(self, file: uc.File) -> int:
            return 1

    with pytest.raises(uc.UdfchainError, match="cannot be sent to the cluster"):
        uc.read_storage(str(data)).settings(cluster=cluster.url).map(n=Holder()).collect()


def test_rust_builtins_run_on_python_executors(cluster: Cluster, data: Path) -> None:
    import hashlib

    q = f"SELECT file.path AS path, sha256(file) AS h FROM read_storage('{data}')"
    try:
        out = uc.run(f"SET cluster = '{cluster.url}'; {q}")
    finally:
        uc.run("SET cluster = 'local'")
    table = out[-1]
    assert not isinstance(table, str), out
    got = dict(zip(table.column("path").to_pylist(), table.column("h").to_pylist()))
    assert got == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in data.iterdir()}


def test_an_executor_killed_mid_query_ends_the_query_in_bounded_time(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "kill", n=2, slots=1, rust_scheduler=False)
    try:
        data = tmp_path / "slow"
        make_files(data, 40, 50)
        chain = uc.read_storage(str(data)).settings(cluster=c.url, workers=2).map(size=cu.slow)
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["rows"] = sorted(chain.collect("size"))
            except Exception as e:  # the query may fail instead, saying why
                out["error"] = e

        import threading

        t = threading.Thread(target=run)
        started = time.monotonic()
        t.start()
        while c.calls() < 4:
            assert time.monotonic() - started < 60, "no call ran"
            time.sleep(0.05)
        c.executors[0].send_signal(signal.SIGKILL)
        t.join(timeout=180)
        assert not t.is_alive(), "the query did not end within 3 minutes of the kill"
        if "rows" in out:
            assert out["rows"] == sorted(p.stat().st_size for p in data.iterdir())
        else:
            assert "executor" in str(out["error"]).lower(), out["error"]
    finally:
        c.stop()


def test_ctrl_c_on_the_client_cancels_the_job_on_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    data = tmp_path / "slow"
    make_files(data, 200, 20)
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import udfchain as uc
            import cluster_udfs as cu
            uc.read_storage({str(data)!r}).settings(cluster={cluster.url!r}, workers=2).map(n=cu.slow).collect()
            """
        )
    )
    before = cluster.calls()
    client = subprocess.Popen(
        [sys.executable, str(script)], env=cluster.env, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while cluster.calls() < before + 2:
        assert time.monotonic() < deadline and client.poll() is None, "no call ran"
        time.sleep(0.05)
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=30)
    assert client.returncode != 0 and b"KeyboardInterrupt" in err, err[-2000:]
    # The executors stop calling within a few seconds: calls running at the
    # cancel (two slots) may finish, no new one starts.
    time.sleep(3)
    settled = cluster.calls()
    time.sleep(3)
    assert cluster.calls() == settled, "the executors kept calling after Ctrl-C"
    assert settled - before < 200


def test_no_executor_is_a_clear_error(tmp_path: Path, data: Path) -> None:
    c = Cluster(tmp_path / "empty", n=0, rust_scheduler=False)
    try:
        t = time.monotonic()
        with pytest.raises(uc.UdfchainError, match="executor"):
            (
                uc.read_storage(str(data))
                .settings(cluster_executor_timeout="2s", cluster=c.url)
                .map(size=cu.size_of)
                .collect()
            )
        assert time.monotonic() - t < 30
    finally:
        c.stop()


def test_the_executor_command_refuses_bad_input_and_says_why(tmp_path: Path) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "udfchain", "cluster", "executor", "--slots", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--slots must be at least 1" in bad.stderr
    port = free_port()
    t = time.monotonic()
    gone = subprocess.run(
        [sys.executable, "-m", "udfchain", "cluster", "executor", "--scheduler", f"127.0.0.1:{port}",
         "--work-dir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert gone.returncode == 1 and f"127.0.0.1:{port}" in gone.stderr, gone.stderr
    assert time.monotonic() - t < 40
