"""Worker processes for pure-Python CPU-bound UDFs: `settings(processes=N)`.

With the GIL, calls of one interpreter take turns; N worker processes give N
interpreters. The engine side is unchanged: the Rust `PyUdf` calls the
`Remote` invoker as it calls an in-process one (on its UDF pool, `parallel`
calls at once, prefetch in front), and that invoker sends the call's rows to
an idle worker over a pipe and returns the worker's values. Guarantees:

- Workers are started with multiprocessing's `spawn` (a fresh interpreter,
  never `fork`: the engine's threads do not survive it) when a UDF with
  `processes=N` is added (until N are idle: they boot while the run starts),
  and reused by later calls and runs; a UDF has at most N calls in workers
  at once.
- A worker runs the same `_udf.Invoker` on the function it unpickles (by
  reference: its module is imported there), so exceptions keep their
  traceback and `on_error` applies as in-process.
- Plain rows (the engine's Python lists: Files as their fields) and values
  cross pickled, and the parent converts the values as in-process, so a
  worker never imports pyarrow (nor numpy) for them and starts in about a
  fifth of the time; other rows cross as Arrow IPC, and values that do not
  pickle are encoded by the worker.
- A worker's `File` objects reach the parent's `FileAccess` of the call
  through the pipe; `read()` and `open()` use the prefetched (or cached)
  local path directly when there is one, so bytes cross only without one.
- A worker that dies (a crash, `os._exit`, a signal) fails its call with its
  exit status, never a hang; it is replaced at the next call. A call whose
  query was dropped (Ctrl-C, a dropped stream) kills its worker within
  `POLL` seconds; workers ignore SIGINT themselves (the parent decides),
  leave when their parent process is gone, and are stopped at exit.
- A function that cannot be imported by module in a new process (a lambda,
  a nested function, one defined in a REPL or `python -c`) is refused when
  the UDF is added, with a TypeError saying why; so is a class UDF whose
  instance (the attributes its constructor set) does not pickle. With
  `cloudpickle` installed, lambdas and `Chain.setup` callables travel by value.
- A UDF with state (`_state`) sets up in a worker on its first call there
  and tears down when the runs using it end (the parent asks each worker
  that set it up), or when the worker exits: at EOF on its pipe, on SIGTERM
  (how a call of a dropped query stops its worker: the call unwinds, the
  worker tears down and exits, and is killed only after `GRACE` seconds),
  or when its parent is gone. A setup that raises fails the run.
- `gpus=` gives the UDF its own workers, each started with its own
  `CUDA_VISIBLE_DEVICES` (`gpu_envs`).
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ._file import File
from ._udf import Invoker, UdfFailure, schema_ipc

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    import pyarrow

    from ._file import Access
    from ._internal import FileAccess
    from ._state import Life

Env = dict[str, str]

# How often a call waiting on a worker checks whether its query dropped it.
POLL = 0.1
# How long a worker asked to stop (EOF, SIGTERM) has to tear down and exit.
GRACE = float(os.environ.get("UDFCHAIN_WORKER_GRACE", "30"))

_SPAWN = multiprocessing.get_context("spawn")
_KEYS = itertools.count()


def _name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name else type(fn).__name__


def _dumps(value: object) -> bytes:
    """`value` pickled; by value with cloudpickle (when installed) for what
    plain pickle cannot send (lambdas, nested functions)."""
    try:
        return pickle.dumps(value)
    except Exception:
        try:
            import cloudpickle
        except ImportError:
            raise
        data: bytes = cloudpickle.dumps(value)
        return data


def spec_of(fn: Callable[..., Any], kind: str, t: bytes, life: Life | None = None) -> bytes:
    """What a worker needs to run `fn` (with `life`, its `_state.Life`),
    pickled; a TypeError when it cannot."""
    where = f"UDF {_name(fn)} cannot run in worker processes (processes=)"
    obj = getattr(life, "obj", None)
    target = type(obj) if obj is not None else fn
    module = getattr(target, "__module__", None)
    main = sys.modules.get("__main__")
    if module == "__main__" and getattr(main, "__file__", None) is None:
        raise TypeError(
            f"{where}: it is defined in an interactive session or `python -c`, which a new "
            "process cannot import; define it in a module or a script file, or run it "
            "in-process (no processes=)"
        )
    try:
        return _dumps((fn, kind, t, life))
    except Exception as e:
        if obj is not None:
            raise TypeError(
                f"{where}: each worker gets a copy of the {type(obj).__name__} instance made "
                f"by pickling it with the attributes its constructor set, and {e}; keep "
                "constructor arguments picklable (paths, names, numbers) and build the rest "
                "in setup(), or run it in-process (no processes=)"
            ) from None
        raise TypeError(
            f"{where}: a worker imports it by module and name, and {e}; define it at the "
            "top level of a module (not a lambda or a nested function), install cloudpickle "
            "to send it by value, or run it in-process (no processes=)"
        ) from None


def gpu_envs(gpus: float, instances: int) -> list[Env]:
    """The environment of each of `instances` workers of a UDF with `gpus`
    per instance (a count, or a fraction: instances sharing a device): its
    `CUDA_VISIBLE_DEVICES`, from the devices this process sees
    (`CUDA_VISIBLE_DEVICES`, else `nvidia-smi -L`). A ValueError when they
    do not suffice."""
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus <= 0:
        raise ValueError(f"gpus must be a positive count or a fraction of one GPU, got {gpus!r}")
    if gpus > 1 and gpus != int(gpus):
        raise ValueError(f"gpus above 1 must be a whole number of GPUs, got {gpus!r}")
    devices = _visible_devices()
    if gpus >= 1:
        per, need = int(gpus), int(gpus) * instances
        groups = [devices[i * per:(i + 1) * per] for i in range(instances)]
    else:
        share = int(1 / gpus + 1e-9)  # instances per device
        need = -(-instances // share)
        groups = [devices[i // share:i // share + 1] for i in range(instances)]
    if need > len(devices):
        seen = ",".join(devices) or "none"
        raise ValueError(
            f"gpus={gpus} for {instances} instance(s) needs {need} GPU(s); this process sees "
            f"{len(devices)} ({seen}; from CUDA_VISIBLE_DEVICES, else nvidia-smi -L)"
        )
    return [{"CUDA_VISIBLE_DEVICES": ",".join(g)} for g in groups]


def _visible_devices() -> list[str]:
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is not None:
        return [d.strip() for d in v.split(",") if d.strip() and d.strip() != "-1"]
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except Exception:
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


# ---------------------------------------------------------------------------
# The parent's side


class _Worker:
    """One spawned worker process and the parent's end of its pipe."""

    def __init__(self, env: Env | None = None, slot: int = 0) -> None:
        parent, child = _SPAWN.Pipe()
        self.process = _SPAWN.Process(
            target=_serve, args=(child, os.getpid(), env), name="udfchain-worker", daemon=True
        )
        self.process.start()
        child.close()  # the worker's death then reads as EOF here
        self.conn = parent
        self.slot = slot  # which of its pool's environments it has
        self.loaded: set[int] = set()  # the UDFs (keys) it has unpickled
        self.states: set[int] = set()  # the stateful UDFs (keys) it was called for
        self.pending: set[int] = set()  # their teardowns asked while it was busy

    def teardown(self, key: int, name: str) -> None:
        """Asks the worker to tear `key`'s state down and waits for it."""
        self.states.discard(key)
        self.pending.discard(key)
        try:
            self.conn.send(("teardown", key, None, None))
            if not self.conn.poll(GRACE):
                raise OSError("no answer")
            msg = self.conn.recv()
        except (EOFError, OSError) as e:
            print(f"udfchain: the teardown of UDF {name} in worker {self.process.pid}: {e}", file=sys.stderr)
            return
        if msg[0] == "fail":
            print(f"udfchain: the teardown of UDF {name} raised: {msg[2]}", file=sys.stderr)

    def died(self, name: str) -> UdfFailure:
        self.process.join(1)
        code = self.process.exitcode
        if code is None:
            status = "closed its pipe"
        elif code < 0:
            try:
                status = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                status = f"was killed by signal {-code}"
        else:
            status = f"exited with code {code}"
        self.kill()
        return UdfFailure(
            None,
            f"{name}: its worker process (pid {self.process.pid}) {status} during the call "
            "(processes=); the worker's stderr may say why",
        )

    def kill(self) -> None:
        """Stops a busy worker: SIGTERM unwinds its call and it tears its
        state down and exits; killed if it has not after `GRACE` seconds
        (at once when it holds no state)."""
        self.conn.close()
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(GRACE if self.states else 2)
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)

    def stop(self) -> None:
        """Asks the worker to leave (EOF on its pipe); kills it if it does not."""
        self.conn.close()
        self.process.join(GRACE if self.states else 2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


class _Pool:
    """Idle workers shared by every UDF of the process (or, with `envs`,
    the workers of one UDF, each with its own environment), started on demand."""

    def __init__(self, envs: list[Env] | None = None) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._closed = False
        self._registered = False
        self._envs = envs
        _POOLS.append(self)

    def _spawn(self) -> _Worker:
        """A new worker (called with the lock held): with `envs`, the first
        environment no live worker has."""
        if not self._envs:
            return _Worker()
        used = {w.slot for w in self._all if w.process.is_alive()}
        slot = next((i for i in range(len(self._envs)) if i not in used), 0)
        return _Worker(self._envs[slot], slot)

    def teardown(self, key: int, name: str) -> None:
        """Tears `key`'s state down in every worker that may hold it: the
        idle ones now, the busy ones when they are given back."""
        with self._lock:
            idle = [w for w in self._idle if key in w.states]
            self._idle = [w for w in self._idle if key not in w.states]
            for w in self._all:
                if key in w.states and w not in idle:
                    w.pending.add(key)
        for w in idle:
            w.teardown(key, name)
            self.give(w)

    def take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise UdfFailure(None, "the Python interpreter is exiting: no worker process")
            while self._idle:
                w = self._idle.pop()
                if w.process.is_alive():
                    return w
                self._all.discard(w)
            if not self._registered:
                # Registered after udfchain's own exit hook, so it runs first.
                atexit.register(self.shutdown)
                self._registered = True
            w = self._spawn()
            self._all.add(w)
        return w

    def prestart(self, n: int) -> None:
        """Starts workers until `n` are idle: they boot (an interpreter,
        udfchain, the UDF's module) while the run plans, lists and fetches."""
        with self._lock:
            if self._closed:
                return
            missing = n - sum(w.process.is_alive() for w in self._idle)
            if not self._registered:
                atexit.register(self.shutdown)
                self._registered = True
        for _ in range(max(0, missing)):
            with self._lock:
                w = self._spawn()
                self._all.add(w)
                self._idle.append(w)

    def give(self, w: _Worker) -> None:
        for key in list(w.pending):
            w.teardown(key, f"key {key}")
        with self._lock:
            if not self._closed and w.process.is_alive():
                self._idle.append(w)
                return
            self._all.discard(w)
        w.stop()

    def drop(self, w: _Worker) -> None:
        with self._lock:
            self._all.discard(w)
        w.kill()

    def shutdown(self, closing: bool = True) -> None:
        """Stops every worker; with `closing`, for good (the interpreter exits)."""
        with self._lock:
            self._closed = closing
            workers = list(self._all)
            self._all.clear()
            self._idle.clear()
        for w in workers:
            w.stop()

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(w.process.pid for w in self._all if w.process.pid is not None)


_POOLS: list[_Pool] = []
POOL = _Pool()


def worker_pids() -> list[int]:
    """The process ids of the running workers (started by `processes=` or `gpus=`)."""
    return sorted(p for pool in _POOLS for p in pool.pids())


def shutdown_workers() -> None:
    """Stops the worker processes now (they are stopped at exit anyway); the
    next call that needs one starts it again."""
    for pool in _POOLS:
        pool.shutdown(closing=False)


class _Cancelled(Exception):
    pass


def _next(w: _Worker, access: FileAccess, name: str) -> Any:
    """The worker's next message other than a file request (served here)."""
    while True:
        while not w.conn.poll(POLL):
            if access.cancelled():
                raise _Cancelled
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            raise w.died(name) from None
        if msg[0] != "file":
            return msg
        _, method, args = msg
        try:
            reply = ("ok", getattr(access, method)(*args))
        except Exception as e:
            reply = ("err", f"{type(e).__name__}: {e}")
        w.conn.send(reply)


@contextmanager
def _slot(slots: threading.Semaphore, access: FileAccess) -> Iterator[None]:
    while not slots.acquire(timeout=POLL):
        if access.cancelled():
            raise UdfFailure(None, "cancelled: the query dropped this call")
    try:
        yield
    finally:
        slots.release()


class Remote:
    """The invoker of `fn` (as `_udf.Invoker`: the same methods) that runs it
    in worker processes, at most `processes` calls at once. Rows cross the
    pipe as the engine gave them: Python lists (pickled; Files as their
    fields) or an Arrow IPC stream; values come back as a list (the parent
    converts them, as in-process) or, when they do not pickle, as the IPC
    stream the worker encoded."""

    def __init__(
        self,
        fn: Callable[..., Any],
        kind: str,
        t: pyarrow.DataType,
        processes: int,
        life: Life | None = None,
        concurrency: int | None = None,
        gpus: float | None = None,
    ) -> None:
        self.spec = spec_of(fn, kind, schema_ipc(_name(fn), t), life)
        self.key = next(_KEYS)
        self.name = _name(fn)
        self.kind = kind
        self._slots = threading.BoundedSemaphore(processes)
        self._encoder = Invoker(fn, kind, t)  # this side's conversions only
        # Read once by the engine (`InvokerInfo`): setup/teardown per run.
        self.stateful = life is not None and life.stateful
        self.concurrency = concurrency
        self._runs = 0
        self._runs_lock = threading.Lock()
        self.pool = _Pool(gpu_envs(gpus, processes)) if gpus is not None else POOL
        self.pool.prestart(processes)

    def setup(self) -> None:
        """A run starts: workers set up on their first call of it."""
        with self._runs_lock:
            self._runs += 1

    def teardown(self) -> None:
        """A run ended: when no other is running, every worker that set the
        UDF up tears it down."""
        with self._runs_lock:
            self._runs -= 1
            last = self._runs == 0
        if last:
            self.pool.teardown(self.key, self.name)

    def _start(self, w: _Worker, op: str, *args: Any) -> None:
        first = self.key not in w.loaded
        try:
            w.conn.send((op, self.key, self.spec if first else None, *args))
        except OSError:
            raise w.died(self.name) from None
        w.loaded.add(self.key)
        if self.stateful:
            w.states.add(self.key)

    def encode(self, out: list[Any]) -> bytes:
        return self._encoder.encode(out)

    def _call(self, rows: bytes | list[list[Any]], access: FileAccess) -> Any:
        with _slot(self._slots, access):
            w = self.pool.take()
            try:
                self._start(w, "call", rows)
                msg = _next(w, access, self.name)
            except _Cancelled:
                self.pool.drop(w)
                raise UdfFailure(None, "cancelled: the query dropped this call") from None
            except BaseException:
                self.pool.drop(w)
                raise
            self.pool.give(w)
            if msg[0] == "fail":
                raise UdfFailure(*msg[1:])
            return msg[1]

    def _gen(self, rows: bytes | list[list[Any]], access: FileAccess, max_rows: int) -> Iterator[Any]:
        with _slot(self._slots, access):
            w = self.pool.take()
            clean = False
            try:
                self._start(w, "gen", rows, max_rows)
                while True:
                    msg = _next(w, access, self.name)
                    if msg[0] == "chunk":
                        yield msg[1]
                    elif msg[0] == "end":
                        clean = True
                        return
                    else:
                        clean = True
                        raise UdfFailure(*msg[1:])
            except _Cancelled:
                raise UdfFailure(None, "cancelled: the query dropped this call") from None
            finally:
                # A generator left before its end (the rows were not wanted)
                # leaves its worker mid-call: that worker cannot be reused.
                if clean:
                    self.pool.give(w)
                else:
                    self.pool.drop(w)

    def __call__(self, ipc: bytes, access: FileAccess, *rest: int) -> Any:
        if self.kind == "gen":
            return self._gen(ipc, access, *rest)
        return self._call(ipc, access)

    def values(self, cols: list[list[Any]], access: FileAccess) -> Any:
        return self._call(cols, access)

    def gen(self, cols: list[list[Any]], access: FileAccess, max_rows: int) -> Iterator[Any]:
        return self._gen(cols, access, max_rows)


def remote(
    fn: Callable[..., Any],
    kind: str,
    t: pyarrow.DataType,
    processes: int,
    life: Life | None = None,
    concurrency: int | None = None,
    gpus: float | None = None,
) -> Remote:
    """`fn` run in `processes` worker processes (see `Remote`)."""
    return Remote(fn, kind, t, processes, life, concurrency, gpus)


# ---------------------------------------------------------------------------
# The worker's side


class _Access:
    """A worker's FileAccess: asks the parent's, over the pipe, for one call."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._open = True
        self._paths: dict[Any, str | None] = {}

    def close(self) -> None:
        self._open = False

    def _ask(self, method: str, *args: Any) -> Any:
        if not self._open:
            raise RuntimeError("this File belongs to a UDF call that has ended: read it inside the UDF")
        self._conn.send(("file", method, args))
        status, value = self._conn.recv()
        if status != "ok":
            raise OSError(value)
        return value

    def local_path(self, f: Any) -> str | None:
        if f not in self._paths:
            self._paths[f] = self._ask("local_path", f)
        return self._paths[f]

    def read(self, f: Any) -> bytes:
        path = self.local_path(f)
        if path is not None:
            with open(path, "rb") as fh:
                return fh.read()
        data: bytes = self._ask("read", f)
        return data

    def read_range(self, f: Any, start: int, end: int) -> bytes:
        path = self.local_path(f)
        if path is not None:
            with open(path, "rb") as fh:
                fh.seek(start)
                return fh.read(max(0, end - start))
        data: bytes = self._ask("read_range", f, start, end)
        return data

    def in_memory(self, f: Any) -> bool:
        return bool(self._ask("in_memory", f))


class _Stop(BaseException):
    """SIGTERM in a worker: unwinds the running call (past the UDF's own
    `except Exception`), then the worker tears down and exits."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def _watch_parent(parent: int) -> None:
    # The pipe's EOF ends an idle worker; this ends a busy one whose parent
    # died (SIGTERM: it tears down first; killed after GRACE if it hangs).
    while True:
        time.sleep(1)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(GRACE)
            os._exit(1)


def _serve(conn: Connection, parent: int, env: Env | None = None) -> None:
    """A worker's loop: runs calls until its pipe closes or SIGTERM; then
    tears down every state it set up."""
    os.environ.update(env or {})
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    invokers: dict[int, Invoker] = {}
    ready: set[int] = set()  # the keys whose state is set up here
    try:
        _loop(conn, invokers, ready)
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop: let teardown finish
        for key in list(ready):
            try:
                invokers[key].teardown()
            except Exception:
                traceback.print_exc()


def _loop(conn: Connection, invokers: dict[int, Invoker], ready: set[int]) -> None:
    broken: dict[int, UdfFailure] = {}  # the keys whose setup failed here, and how
    while True:
        try:
            op, key, spec, rows, *rest = conn.recv()
        except (EOFError, OSError):
            return
        if op == "teardown":
            reply: tuple[Any, ...] = ("done",)
            broken.pop(key, None)  # the run ended: the next one may set up again
            if key in ready:
                ready.discard(key)
                try:
                    invokers[key].teardown()
                except Exception as e:
                    text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
                    reply = ("fail", None, text)
            conn.send(reply)
            continue
        access = _Access(conn)
        try:
            inv = invokers.get(key)
            if inv is None:
                try:
                    fn, kind, schema, life = pickle.loads(spec)
                except Exception as e:
                    text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
                    raise UdfFailure(None, f"cannot load the UDF in a worker process: {text}") from None
                inv = invokers[key] = Invoker(fn, kind, schema, life)
            if inv.stateful and key not in ready:
                if key in broken:  # its setup failed here: not tried again
                    raise broken[key]
                try:
                    inv.setup()
                except UdfFailure as e:  # setup=True
                    broken[key] = e
                    raise
                ready.add(key)
            if isinstance(rows, bytes):  # an IPC stream: the invoker encodes
                if op == "call":
                    conn.send(("done", inv(rows, access)))
                else:
                    for chunk in inv(rows, access, rest[0]):
                        conn.send(("chunk", chunk))
                    conn.send(("end",))
            else:
                _attach(rows, access)
                if op == "call":
                    _send_values(conn, "done", inv, inv.values(rows, access))
                else:
                    for values in inv.gen(rows, access, rest[0]):
                        _send_values(conn, "chunk", inv, values)
                    conn.send(("end",))
        except UdfFailure as e:
            conn.send(("fail", e.row, e.text, e.setup))
        except Exception as e:
            text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
            conn.send(("fail", None, text, False))
        finally:
            access.close()


def _attach(cols: list[list[Any]], access: Access) -> None:
    """Files arrive as their fields: they read through this worker's call."""
    for col in cols:
        for v in col:
            if isinstance(v, File):
                v._access = access


def _send_values(conn: Connection, tag: str, inv: Invoker, values: list[Any]) -> None:
    """`values` as they are (pickled), or encoded here when they do not pickle."""
    try:
        data = pickle.dumps((tag, values), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        conn.send((tag, inv.encode(values)))
        return
    conn.send_bytes(data)
