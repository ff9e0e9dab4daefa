"""State once per worker: class UDFs (`setup` / `process` / `teardown`) of
the four kinds and `Chain.setup` values, in-process and in worker processes;
teardown exactly once per setup on success, error, Ctrl-C and a killed
worker; a failing setup fails the run at once; `concurrency`; `gpus`."""

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Iterator

import pytest

import udfchain as uc
from conftest import make_files
from pathlib import Path
from typing import Literal


# Every UDF here is at module level: a worker imports it by module and name.
# Setups and teardowns are counted in the file $MODELS_LOG, one line each.


def log(event: str) -> None:
    with open(os.environ["MODELS_LOG"], "a") as f:
        f.write(f"{event} {os.getpid()}\n")


def events(path: Path) -> list[tuple[str, int]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(e, int(p)) for e, p in (line.split() for line in f if line.strip())]


def count(path: Path, event: str) -> int:
    return sum(1 for e, _ in events(path) if e == event)


def settled(path: Path, timeout: float = 10.0) -> tuple[int, int]:
    """(setups, teardowns) once every setup is torn down (or the timeout)."""
    deadline = time.monotonic() + timeout
    while count(path, "teardown") < count(path, "setup") and time.monotonic() < deadline:
        time.sleep(0.05)
    return count(path, "setup"), count(path, "teardown")


@pytest.fixture
def model_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "models.log"
    monkeypatch.setenv("MODELS_LOG", str(path))
    uc.shutdown_workers()  # workers started now read this test's MODELS_LOG
    yield path
    uc.shutdown_workers()


class Size(uc.Mapper):
    """The file's size plus a bias that setup loads (and teardown drops)."""

    def __init__(self, bias: int, fail_on: str | None = None) -> None:
        self.bias = bias
        self.fail_on = fail_on
        self.model: dict[str, int] | None = None

    def setup(self) -> None:
        time.sleep(0.05)  # calls pile up behind a slow load
        log("setup")
        self.model = {"bias": self.bias}

    def process(self, file: uc.File) -> int:
        if file.path == self.fail_on:
            raise ValueError(f"bad file {file.path}")
        assert self.model is not None
        return file.size + self.model["bias"]

    def teardown(self) -> None:
        log("teardown")
        self.model = None


class Chunks(uc.Generator):
    def setup(self) -> None:
        log("setup")
        self.step = 400

    def process(self, file: uc.File) -> Iterator[int]:
        data = file.read()
        for i in range(0, len(data), self.step):
            yield len(data[i : i + self.step])

    def teardown(self) -> None:
        log("teardown")


class Lengths(uc.BatchMapper):
    def setup(self) -> None:
        log("setup")
        self.calls = 0

    def process(self, file: list[uc.File]) -> list[int]:
        self.calls += 1
        return [len(f.read()) for f in file]

    def teardown(self) -> None:
        log("teardown")


class Total(uc.Aggregator):
    def setup(self) -> None:
        log("setup")

    def process(self, n: list[int]) -> Iterator[int]:
        yield sum(n)

    def teardown(self) -> None:
        log("teardown")


class BrokenSetup(uc.Mapper):
    def setup(self) -> None:
        log("setup")
        raise RuntimeError("weights not found at /models/missing.onnx")

    def process(self, file: uc.File) -> int:
        return file.size


class Slow(uc.Mapper):
    def setup(self) -> None:
        log("setup")

    def process(self, file: uc.File) -> int:
        time.sleep(0.2)
        return file.size

    def teardown(self) -> None:
        log("teardown")


class InFlight(uc.Mapper):
    """Counts the calls running at once in this process (and their peak)."""

    lock = threading.Lock()
    now = 0
    peak = 0

    def process(self, file: uc.File) -> int:
        with InFlight.lock:
            InFlight.now += 1
            InFlight.peak = max(InFlight.peak, InFlight.now)
        time.sleep(0.01)
        with InFlight.lock:
            InFlight.now -= 1
        return file.size


def load_model() -> dict[str, int]:
    log("setup")
    return {"bias": 1000}


def with_model(file: uc.File, model: dict[str, int]) -> int:
    return file.size + model["bias"]


def devices(file: uc.File) -> str:
    time.sleep(0.2)
    return os.environ.get("CUDA_VISIBLE_DEVICES", "unset")


def test_a_class_mapper_sets_up_once_across_threads_and_tears_down_once(files: tuple[Path, dict[str, bytes]], model_log: Path) -> None:
    d, data = files
    c = uc.read_storage(str(d)).settings(parallel=8, prefetch=4).map(n=Size(10))
    got = sorted(c.collect("n"))
    assert got == sorted(len(b) + 10 for b in data.values())
    assert settled(model_log) == (1, 1)
    # Each run its own setup: a second run sets up again.
    assert c.count() == len(data)
    assert settled(model_log) == (2, 2)


def test_each_kind_of_class_udf_runs_with_its_state(files: tuple[Path, dict[str, bytes]], model_log: Path) -> None:
    d, data = files
    c = (
        uc.read_storage(str(d))
        .settings(batch_size=5)
        .batch_map(n=Lengths())
        .gen(part=Chunks())
        .agg(total=Total(), params="part", partition_by="n")
    )
    totals = dict(zip(*[c.collect(k) for k in ("n", "total")]))
    # Every file's chunk lengths add up to its length (and equal lengths group).
    for n, total in totals.items():
        assert total == n * sum(1 for b in data.values() if len(b) == n)
    assert settled(model_log) == (3 * 2, 3 * 2)  # collect() ran the chain twice


def test_setup_values_reach_the_parameter_of_that_name(files: tuple[Path, dict[str, bytes]], model_log: Path) -> None:
    d, data = files
    c = uc.read_storage(str(d)).setup(model=load_model).settings(parallel=4)
    got = sorted(c.map(n=with_model).collect("n"))
    assert got == sorted(len(b) + 1000 for b in data.values())
    assert count(model_log, "setup") == 1
    # Built once per process and kept: a lambda too, and later runs reuse it.
    calls: list[int] = []

    def five() -> dict[str, int]:
        calls.append(1)
        return {"bias": 5}

    c2 = uc.read_storage(str(d)).setup(model=lambda: five())
    c2 = c2.map(n=with_model)
    assert sorted(c2.collect("n")) == sorted(len(b) + 5 for b in data.values())
    assert c2.count() == len(data)
    assert calls == [1]


def test_a_udf_error_still_tears_down_once(files: tuple[Path, dict[str, bytes]], model_log: Path) -> None:
    d, _ = files
    c = uc.read_storage(str(d)).settings(parallel=4).map(n=Size(1, fail_on="f005.bin"))
    with pytest.raises(uc.UdfchainError, match="bad file f005.bin"):
        c.collect()
    assert settled(model_log) == (1, 1)


@pytest.mark.parametrize("on_error", ["skip", "null", "fail"])
@pytest.mark.parametrize("processes", [None, 2])
def test_a_failing_setup_fails_the_run_at_once_with_its_traceback(files: tuple[Path, dict[str, bytes]], model_log: Path, on_error: Literal["skip", "null", "fail"], processes: int | None) -> None:
    d, _ = files
    c = uc.read_storage(str(d)).settings(on_error=on_error, processes=processes, parallel=4)
    start = time.monotonic()
    with pytest.raises(uc.UdfchainError) as e:
        c.map(n=BrokenSetup()).collect()
    text = str(e.value)
    assert "BrokenSetup" in text and "weights not found at /models/missing.onnx" in text, text
    assert "Traceback" in text and "in setup" in text, text
    assert time.monotonic() - start < 30
    # Never once per row: in-process once; in workers at most once in each.
    assert 1 <= count(model_log, "setup") <= (processes or 1)
    assert count(model_log, "teardown") == 0


def test_concurrency_1_is_never_exceeded_under_parallel_8(tmp_path: Path) -> None:
    d = tmp_path / "many"
    make_files(d, 40, size=50)
    InFlight.peak = 0
    n = uc.read_storage(str(d)).settings(parallel=8).map(n=InFlight(), concurrency=1).count()
    assert n == 40
    assert InFlight.peak == 1
    InFlight.peak = 0
    uc.read_storage(str(d)).settings(parallel=8).map(n=InFlight()).count()
    assert InFlight.peak > 1, "without the bound, calls overlap"
    with pytest.raises(ValueError, match="concurrency"):
        uc.read_storage(str(d)).map(n=InFlight(), concurrency=0)


def test_in_workers_setup_runs_once_per_worker_and_teardown_once_per_setup(files: tuple[Path, dict[str, bytes]], model_log: Path) -> None:
    d, data = files
    uc.shutdown_workers()
    c = uc.read_storage(str(d)).settings(processes=2, prefetch=4).map(n=Slow())
    assert sorted(c.collect("n")) == sorted(len(b) for b in data.values())
    setups, teardowns = settled(model_log)
    assert setups == teardowns
    pids = {p for e, p in events(model_log) if e == "setup"}
    assert 1 <= setups <= 2 and len(pids) == setups, events(model_log)
    assert os.getpid() not in pids
    # Each setup torn down in its own process.
    assert sorted(p for e, p in events(model_log) if e == "teardown") == sorted(
        p for e, p in events(model_log) if e == "setup"
    )


def test_setup_values_in_workers_are_built_once_per_worker(files: tuple[Path, dict[str, bytes]], model_log: Path) -> None:
    d, data = files
    uc.shutdown_workers()
    c = uc.read_storage(str(d)).setup(model=load_model).settings(processes=2).map(n=with_model)
    assert sorted(c.collect("n")) == sorted(len(b) + 1000 for b in data.values())
    setups = [p for e, p in events(model_log) if e == "setup"]
    assert 1 <= len(setups) <= 2 and len(set(setups)) == len(setups)


class KilledOnF003(Slow):
    def process(self, file: uc.File) -> int:
        if file.path == "f003.bin":
            log("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().process(file)


def test_a_killed_worker_fails_its_call_and_the_others_tear_down(tmp_path: Path, model_log: Path) -> None:
    d = tmp_path / "data"
    make_files(d, 12)
    c = uc.read_storage(str(d)).settings(processes=2).map(n=KilledOnF003())
    with pytest.raises(uc.UdfchainError, match="worker process .* was killed by signal SIGKILL"):
        c.collect()
    deadline = time.monotonic() + 10
    killed = {p for e, p in events(model_log) if e == "killed"}
    set_up = {p for e, p in events(model_log) if e == "setup"}
    while time.monotonic() < deadline:
        torn = [p for e, p in events(model_log) if e == "teardown"]
        if set(torn) >= set_up - killed:
            break
        time.sleep(0.05)
    # The killed worker's state died with it; every other setup is torn down
    # exactly once, in its own process.
    assert len(killed) == 1
    assert sorted(torn) == sorted(set_up - killed), events(model_log)
    assert len(set_up) == count(model_log, "setup")


class Unpicklable(uc.Mapper):
    def __init__(self) -> None:
        self.lock = threading.Lock()  # a constructor argument that cannot travel

    def process(self, file: uc.File) -> int:
        return file.size


def test_a_class_whose_instance_does_not_pickle_is_refused_under_processes(files: tuple[Path, dict[str, bytes]]) -> None:
    d, _ = files
    c = uc.read_storage(str(d)).settings(processes=2)
    with pytest.raises(TypeError, match="Unpicklable.*pickl.*constructor"):
        c.map(n=Unpicklable())
    # In-process it runs.
    assert uc.read_storage(str(d)).map(n=Unpicklable()).count() == 12


def test_class_udfs_are_checked_when_added(files: tuple[Path, dict[str, bytes]]) -> None:
    d, _ = files
    c = uc.read_storage(str(d))
    with pytest.raises(TypeError, match="BatchMapper: add it with batch_map"):
        c.map(n=Lengths())
    with pytest.raises(TypeError, match="pass an instance"):
        c.map(n=Size)


def test_gpus_give_each_worker_its_own_devices(files: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = files
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    c = uc.read_storage(str(d)).settings(parallel=2)
    got = set(c.map(dev=devices, gpus=1, concurrency=2).collect("dev"))
    assert got == {"0", "1"}, got
    got = set(c.map(dev=devices, gpus=0.5, concurrency=2).collect("dev"))
    assert got == {"0"}, got
    got = set(c.map(dev=devices, gpus=2).collect("dev"))
    assert got == {"0,1"}, got
    with pytest.raises(ValueError, match="needs 3 GPU"):
        c.map(dev=devices, gpus=1, concurrency=3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="sees 0"):
        c.map(dev=devices, gpus=1)
    uc.shutdown_workers()


def test_register_takes_a_class_mapper(files: tuple[Path, dict[str, bytes]], model_log: Path) -> None:
    d, data = files
    uc.register("biased_size", Size(7))
    t = uc.query(f"SELECT biased_size(file) AS n FROM read_storage('{d}')").to_pyarrow()
    assert sorted(t.column("n").to_pylist()) == sorted(len(b) + 7 for b in data.values())
    assert settled(model_log) == (1, 1)


CTRL_C = textwrap.dedent(
    """
    import os, sys, time
    import udfchain as uc

    class Slow(uc.Mapper):
        def setup(self) -> None:
            with open(os.environ["MODELS_LOG"], "a") as f:
                f.write(f"setup {os.getpid()}\\n")

        def process(self, file: uc.File) -> int:
            print("call", flush=True)
            time.sleep(0.05)
            return file.size

        def teardown(self) -> None:
            with open(os.environ["MODELS_LOG"], "a") as f:
                f.write(f"teardown {os.getpid()}\\n")

    if __name__ == "__main__":
        processes = int(sys.argv[2]) or None
        try:
            uc.read_storage(sys.argv[1]).settings(parallel=2, processes=processes).map(n=Slow()).collect()
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    """
)


@pytest.mark.parametrize("processes", [0, 2])
def test_ctrl_c_tears_down_once_per_setup(tmp_path: Path, root: Path, model_log: Path, processes: int) -> None:
    d = tmp_path / "many"
    make_files(d, 300, size=100)
    script = tmp_path / "slow.py"
    script.write_text(CTRL_C)
    p = subprocess.Popen(
        [sys.executable, str(script), str(d), str(processes)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "UDFCHAIN_ROOT": str(root), "UDFCHAIN_WORKER_GRACE": "10"},
    )
    calls = 0
    assert p.stdout is not None
    for line in p.stdout:
        calls += line.strip() == "call"
        if calls >= 4:
            break
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    setups, teardowns = count(model_log, "setup"), count(model_log, "teardown")
    assert setups >= 1 and teardowns == setups, (events(model_log), err)
