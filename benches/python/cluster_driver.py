"""Workload C-py of the cluster benchmark (run by benches/cluster.rs).

    python cluster_driver.py --dir SCRATCH [--quick] [--files N]

A pure-Python CPU-bound UDF over local files: the Python benchmark's
workload C (`udfs.burn_file`, a byte loop calibrated here by
`driver.calibrate` to ~20 ms of CPU per 4 KiB file; 600 files, `--quick`
200, `--files N`), run three ways with
the same settings (`parallel=1, prefetch=2, cache=False`: one UDF call at a
time, as one executor slot runs one task):

- `local`: in this interpreter, no cluster;
- `one executor`: `cluster=df://127.0.0.1:PORT, workers=1` on one Python
  executor (`python -m udfchain cluster executor --slots 1`);
- `two executors`: `workers=2` on two Python executors of one slot each.

Each cluster has its own scheduler (`python -m udfchain cluster scheduler`);
all are child processes of this one on 127.0.0.1, with this directory on
their PYTHONPATH (the executors import `udfs` by module and name: no
cloudpickle needed) and AWS_METADATA_ENDPOINT=http://127.0.0.1:1. A cluster
is ready when a probe chain's calls ran in as many executor processes as it
has. Each configuration: one warm-up run, then the best of `REPEATS`, each
timed from building the chain to having every row's value, and its values
checked against the local run's. Children are killed on every exit path
(finally, SIGTERM, and the kernel's parent-death signal if this process is
killed outright); a watchdog ends the whole run after `--deadline` seconds.

After them, the loop alone (no engine) in one spawned process and in two
(`bare_two_over_one`): what this machine gives two processes over one, the
ceiling of the two executors' speedup (2 at most on 2 cores, less when the
cores are shared).

Prints one JSON line on stdout: `skipped` when udfchain cannot be imported,
else the calibration and the seconds of each configuration (null for one
that failed, its error under `errors` by mode). Logs of the children are under
SCRATCH. Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

REPEATS = 2
C_SIZE = 4 * 1024
SETTINGS = {"parallel": 1, "prefetch": 2, "cache": False}

# Sets the parent-death signal, then execs the command: a child outlives
# this process by nothing even when it is killed with SIGKILL (Linux; a
# no-op elsewhere). Done in the child before exec, not in preexec_fn, which
# is unsafe once udfchain's threads run.
_EXEC_DYING_WITH_PARENT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the parent is already gone
os.execvp(sys.argv[2], sys.argv[2:])
"""

_children: list[subprocess.Popen[bytes]] = []


def log(msg: str) -> None:
    print(f"cluster_driver: {msg}", file=sys.stderr, flush=True)


def spawn(cmd: list[str], logfile: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(logfile, "wb") as out:
        p = subprocess.Popen(
            [sys.executable, "-c", _EXEC_DYING_WITH_PARENT, str(os.getpid()), *cmd],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    _children.append(p)
    return p


def stop_children() -> None:
    while _children:
        p = _children.pop()
        if p.poll() is None:
            p.kill()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


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


def tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-1500:].decode(errors="replace")
    except OSError:
        return ""


def write_files(directory: str, n: int, size: int) -> None:
    os.makedirs(directory, exist_ok=True)
    for i in range(n):
        with open(os.path.join(directory, f"f{i:05}.bin"), "wb") as f:
            f.write(bytes((i * 131 + j * 7) % 251 for j in range(size)))


def start_cluster(n: int, scratch: str, env: dict[str, str]) -> str:
    """A scheduler and `n` executors of one slot each; the cluster's URL
    once a probe chain's calls ran in `n` executor processes."""
    import udfchain as uc
    import udfs

    port = free_port()
    url = f"df://127.0.0.1:{port}"
    sched_log = os.path.join(scratch, f"scheduler-{n}.log")
    py = [sys.executable, "-m", "udfchain", "cluster"]
    spawn([*py, "scheduler", "--bind", f"127.0.0.1:{port}"], sched_log, env)
    deadline = time.monotonic() + 30
    while not answers(port):
        if time.monotonic() > deadline:
            raise RuntimeError("the scheduler did not start: " + tail(sched_log))
        time.sleep(0.1)
    pids = set()
    for i in range(n):
        work = os.path.join(scratch, f"exec{n}-{i}")
        cmd = [*py, "executor", "--scheduler", f"127.0.0.1:{port}", "--slots", "1", "--work-dir", work]
        pids.add(spawn(cmd, work + ".log", env).pid)
    probe = os.path.join(scratch, f"probe{n}")
    write_files(probe, 4 * n, 16)
    deadline = time.monotonic() + 90
    while True:
        try:
            ran = set(
                uc.read_storage(probe).settings(**SETTINGS, cluster=url, workers=n).map(pid=udfs.pid_file).collect("pid")
            )
        except Exception as e:  # noqa: BLE001 - retried until the deadline, then said
            ran, last = set(), repr(e)
        else:
            last = f"calls ran in {len(ran)} of {n} executors"
            if len(ran) >= n:
                if not ran <= pids:
                    raise RuntimeError(f"probe calls ran in {ran}, not in the executors {pids}")
                return url
        if time.monotonic() > deadline:
            raise RuntimeError(f"the executors were not ready in 90 s ({last}): " + tail(os.path.join(scratch, f"exec{n}-0.log")))
        time.sleep(0.5)


def measure(path: str, extra: dict[str, object], expected: list[int] | None) -> tuple[float, list[int]]:
    """Seconds of the best of `REPEATS` runs after a warm-up, and the sorted values."""
    import udfchain as uc
    import udfs

    def run() -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        values = uc.read_storage(path).settings(**SETTINGS, **extra).map(out=udfs.burn_file).collect("out")
        secs = time.perf_counter() - t0
        values = sorted(values)
        if expected is not None and values != expected:
            raise RuntimeError(f"{len(values)} values, not the local run's {len(expected)} (or different values)")
        return secs, values

    _, values = run()  # warm-up
    return min(run()[0] for _ in range(REPEATS)), values


def bare_loop(rounds: int, processes: int, files: int) -> float:
    """Files/s of the UDF's loop alone (no engine, no I/O) in `processes`
    spawned processes sharing `files` calls (the best of `REPEATS`, after a
    call in each to start them): with 1 and 2 it gives what this
    machine lets two processes gain over one, the ceiling of the two
    executors' speedup."""
    import multiprocessing

    from driver import _burn_n

    per = max(1, files // processes)
    best = float("inf")
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(_burn_n, [(rounds, C_SIZE, 1)] * processes)  # started and warm
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            pool.map(_burn_n, [(rounds, C_SIZE, per)] * processes, chunksize=1)
            best = min(best, time.perf_counter() - t0)
    return per * processes / best


def main() -> None:
    args = sys.argv[1:]
    quick = "--quick" in args
    scratch = os.path.abspath(args[args.index("--dir") + 1]) if "--dir" in args else None
    files = int(args[args.index("--files") + 1]) if "--files" in args else (200 if quick else 600)
    deadline = float(args[args.index("--deadline") + 1]) if "--deadline" in args else (300.0 if quick else 900.0)
    if scratch is None:
        raise SystemExit("usage: cluster_driver.py --dir SCRATCH [--quick] [--files N] [--deadline S]")
    os.makedirs(scratch, exist_ok=True)
    os.environ.setdefault("UDFCHAIN_ROOT", os.path.join(scratch, "root"))
    os.environ.setdefault("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
    try:
        import udfchain as uc
        import udfchain.cluster  # noqa: F401 - Python executors (an older package has none)
    except Exception as e:  # noqa: BLE001 - any failure to import is the reason to skip
        print(json.dumps({"skipped": f"{sys.executable} cannot import udfchain: {e!r}"}), flush=True)
        return
    from driver import calibrate

    def on_deadline() -> None:
        stop_children()
        print(json.dumps({"error": f"no result within {deadline:.0f} s (the driver's deadline)"}), flush=True)
        os._exit(3)

    watchdog = threading.Timer(deadline, on_deadline)
    watchdog.daemon = True
    watchdog.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    rounds, t_udf = calibrate(C_SIZE)  # sets udfs.ROUNDS here
    data = os.path.join(scratch, "c-py")
    write_files(data, files, C_SIZE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p),
        "UDFCHAIN_BENCH_BURN_ROUNDS": str(rounds),
        "AWS_METADATA_ENDPOINT": "http://127.0.0.1:1",
    }
    out: dict[str, object] = {
        "workload": "C-py",
        "files": files,
        "file_bytes": C_SIZE,
        "burn_rounds": rounds,
        "t_udf_seconds": t_udf,
        "cores": os.cpu_count() or 1,
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "udfchain": getattr(uc, "__version__", None),
        "settings": SETTINGS,
        "repeats": REPEATS,
    }
    errors: dict[str, str] = {}
    seconds: dict[str, float | None] = {}
    log(f"C-py: {files} files, {rounds} rounds, t_udf {t_udf * 1e3:.1f} ms; local")
    expected: list[int] | None = None
    try:
        seconds["local"], expected = measure(data, {}, None)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        seconds["local"], errors["local"] = None, repr(e)
    for n, key, mode in [(1, "one", "one executor"), (2, "two", "two executors")]:
        log(f"C-py: {mode}")
        try:
            url = start_cluster(n, scratch, env)
            seconds[key], _ = measure(data, {"cluster": url, "workers": n}, expected)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            seconds[key], errors[mode] = None, repr(e)[:2000]
        finally:
            stop_children()
    out.update(seconds)
    try:
        bare = max(20, files // 2)
        one_p, two_p = bare_loop(rounds, 1, bare), bare_loop(rounds, 2, bare)
        out.update(bare_one_files_per_s=one_p, bare_two_files_per_s=two_p, bare_two_over_one=two_p / one_p)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        errors["bare loop"] = repr(e)
    if errors:
        out["errors"] = errors
    watchdog.cancel()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_children()
