"""State built once per worker: class UDFs (`Mapper`, `Generator`,
`BatchMapper`, `Aggregator` with `setup` / `process` / `teardown`) and the
values of `Chain.setup(name=callable)`.

Guarantees (the engine's side is `Lifecycle` in the Rust crate):
- A class UDF's `setup()` runs once per worker before its first call (in
  the process: once per run, shared by the calls running at once; with
  `processes=N`: once in each worker process that gets a call), and its
  `teardown()` exactly once after each `setup()` that returned: at the end
  of the run however it ends, or when a worker process exits.
- A `Chain.setup` value is built once per process, on the first run of a UDF
  that names it (its parameter of that name receives it) and kept for later
  runs; it has no teardown (as DataChain's).
- An exception in either fails the run with `SetupFailure` (the UDF's name
  and the traceback): never once per row, never skipped by `on_error`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeGuard


class _Udf:
    """The base of the four class UDFs: override `process` (annotated with
    its return type, or pass `output=` when adding it), and `setup` /
    `teardown` when the UDF holds state. The instance given to `map(...)`
    is the one that runs in this process; under `processes=`, a copy of it
    made by pickling (so constructor arguments travel, the state that
    `setup` builds does not) runs in each worker."""

    kind: ClassVar[str] = "map"

    def setup(self) -> None:
        """Builds the state (a model, a client) once per worker."""

    def process(self, *args: Any) -> Any:  # pragma: no cover - overridden
        """The UDF's work for one call: its parameters name the columns it
        reads (as a function UDF's do), its return annotation the output type."""
        raise NotImplementedError(f"{type(self).__name__} must define process(...)")

    def teardown(self) -> None:
        """Releases what `setup` built."""


class Mapper(_Udf):
    """One value per row: `process(self, file) -> T`."""

    kind = "map"


class Generator(_Udf):
    """Zero or more values per row: `process(self, file) -> Iterator[T]` (yields)."""

    kind = "gen"


class BatchMapper(_Udf):
    """One value per row, `batch_size` rows per call: `process(self, files: list) -> list[T]`."""

    kind = "batch_map"


class Aggregator(_Udf):
    """Values per group of rows: `process(self, files: list) -> Iterator[T]`."""

    kind = "agg"


def is_class_udf(v: object) -> TypeGuard[_Udf]:
    return isinstance(v, _Udf)


class Setups:
    """The callables given to `Chain.setup`, and the values built from them
    in this process (each once; pickled without its values, so a worker
    process builds its own)."""

    def __init__(self, fns: dict[str, Callable[[], Any]] | None = None) -> None:
        self._init(fns)

    def _init(self, fns: dict[str, Callable[[], Any]] | None) -> None:
        self.fns = dict(fns or {})
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()

    def extended(self, fns: dict[str, Callable[[], Any]]) -> Setups:
        for name, fn in fns.items():
            if not callable(fn):
                raise TypeError(f"setup({name}=...) takes a callable that builds the value, got {fn!r}")
        return Setups({**self.fns, **fns})

    def names(self) -> set[str]:
        return set(self.fns)

    def values(self, names: Iterable[str]) -> dict[str, Any]:
        """The values of `names`, each built on first use (one at a time)."""
        with self._lock:
            for n in names:
                if n not in self._values:
                    self._values[n] = self.fns[n]()
            return {n: self._values[n] for n in names}

    def __getstate__(self) -> dict[str, Any]:
        return {"fns": self.fns}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._init(state["fns"])


class Life:
    """The setup and teardown of one UDF in one process, counted: the engine
    may set up the same UDF for two runs at once; the state is built by the
    first and torn down by the last."""

    def __init__(self, obj: _Udf | None, setups: Setups | None, needs: list[str]) -> None:
        self._init(obj, setups, needs)

    def _init(self, obj: _Udf | None, setups: Setups | None, needs: list[str]) -> None:
        self.obj = obj
        self.setups = setups
        self.needs = needs
        self.values: dict[str, Any] = {}
        self._users = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"obj": self.obj, "setups": self.setups, "needs": self.needs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._init(state["obj"], state["setups"], state["needs"])

    @property
    def stateful(self) -> bool:
        return self.obj is not None or bool(self.needs)

    def setup(self) -> None:
        """Raises what the setup raised (the caller reports it)."""
        with self._lock:
            if self._users == 0:
                if self.needs and self.setups is not None:
                    self.values = self.setups.values(self.needs)
                if self.obj is not None:
                    self.obj.setup()
            self._users += 1

    def teardown(self) -> None:
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0 and self.obj is not None:
                self.obj.teardown()
