"""Python UDFs as they travel to cluster executors (`settings(cluster=...)`).

A UDF's code is one header line of JSON (`udfchain`, `python`: the client's
versions; `by`: "reference" or "value"; `cloudpickle`: its version when it
pickled), then a pickle of what the client built the UDF from: the function
(or class UDF instance, with its `Chain.setup` callables), its kind, output
type, `processes`, `concurrency` and `gpus`. An executor rebuilds the same
invoker from them (`load`), in its own process or its own worker processes.

Guarantees:
- A function (or class) importable by module and name travels by reference:
  the executor imports its module, so the module must be installed there (or
  on its PYTHONPATH). Lambdas, nested functions and what a script's
  `__main__` defines travel by value with cloudpickle, which must then be
  installed on both sides; without it they are refused on the client, saying
  so.
- An executor refuses a UDF pickled by another udfchain version or another
  Python (major.minor), naming both versions, before unpickling anything.
- A module the executor cannot import, or a pickle it cannot read, is a
  `ShipError` naming the module and the Python error; the engine fails the
  query with it, naming the UDF and the executor.
"""

from __future__ import annotations

import importlib
import json
import pickle
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _internal

if TYPE_CHECKING:
    import pyarrow

    from ._state import Life
    from ._udf import Invoker
    from ._workers import Remote

MAGIC = b"udfchain-python-udf/1\n"

VERSION = _internal.version()
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


class ShipError(RuntimeError):
    """A UDF's code cannot be sent from this client or loaded on this executor."""


def _by_value(fn: Callable[..., Any], life: Life | None) -> bool:
    """Whether the UDF's function (or class) cannot be imported by module
    and name in another process: a lambda, a nested function, `__main__`'s."""
    obj = getattr(life, "obj", None)
    target = type(obj) if obj is not None else fn
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "") or ""
    return module in (None, "__main__") or "<" in qualname


def ship(
    fn: Callable[..., Any],
    kind: str,
    t: pyarrow.DataType,
    processes: int | None,
    life: Life | None,
    concurrency: int | None,
    gpus: float | None,
) -> bytes:
    """The code of a UDF (see the module's doc); a ShipError when it cannot travel."""
    from ._udf import _name, schema_ipc

    parts = (fn, kind, schema_ipc("value", t), processes, life, concurrency, gpus)
    by_value = _by_value(fn, life)
    cloudpickle: Any = None
    try:
        cloudpickle = importlib.import_module("cloudpickle")
    except ImportError:
        pass
    where = f"UDF {_name(fn)} cannot be sent to the cluster"
    if cloudpickle is not None:
        try:
            body: bytes = cloudpickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise ShipError(f"{where}: cloudpickle cannot pickle it: {type(e).__name__}: {e}") from None
    else:
        if by_value:
            raise ShipError(
                f"{where}: it is a lambda, a nested function or defined in __main__, so it travels "
                "by value, which needs cloudpickle: `pip install cloudpickle` on the client and the "
                "executors, or define it at the top level of a module the executors can import"
            )
        try:
            body = pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise ShipError(
                f"{where}: {type(e).__name__}: {e}; install cloudpickle (on the client and the "
                "executors) to send what plain pickle cannot (lambdas, Chain.setup closures)"
            ) from None
    header = {
        "udfchain": VERSION,
        "python": PYTHON,
        "by": "value" if by_value else "reference",
        "cloudpickle": getattr(cloudpickle, "__version__", None),
    }
    return MAGIC + json.dumps(header).encode() + b"\n" + body


def header(code: bytes) -> dict[str, Any]:
    """The header of a UDF's code; a ShipError when it is not one."""
    if not code.startswith(MAGIC):
        raise ShipError("this is not the code of a udfchain Python UDF (or of another format version)")
    line, sep, _ = code[len(MAGIC):].partition(b"\n")
    try:
        meta = json.loads(line) if sep else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise ShipError("the code of a Python UDF has no readable header")
    return meta


def load(code: bytes, kind: str) -> Invoker | Remote:
    """The invoker of a UDF's code, on an executor (see the module's doc)."""
    from ._chain import udf_invoker
    from ._pyarrow import pa

    meta = header(code)
    theirs = meta.get("udfchain")
    if theirs != VERSION:
        raise ShipError(
            f"the client runs udfchain {theirs} and this executor udfchain {VERSION}: "
            "run the same udfchain version on the client and the executors"
        )
    pickled_by = meta.get("python")
    if pickled_by != PYTHON:
        raise ShipError(
            f"the UDF was pickled by Python {pickled_by} on the client and this executor runs "
            f"Python {PYTHON}: run the same Python version (major.minor) on the client and the executors"
        )
    body = code[len(MAGIC):].partition(b"\n")[2]
    try:
        fn, shipped_kind, schema, processes, life, concurrency, gpus = pickle.loads(body)
    except ModuleNotFoundError as e:
        hint = (
            "`pip install cloudpickle` on this executor (the UDF travels by value)"
            if e.name == "cloudpickle"
            else "install it on this executor or put it on its PYTHONPATH"
        )
        raise ShipError(f"cannot import module {e.name!r} here: ModuleNotFoundError: {e}; {hint}") from None
    except Exception as e:
        raise ShipError(f"cannot unpickle the UDF here: {type(e).__name__}: {e}") from None
    if shipped_kind != kind:
        raise ShipError(f"the code is of a {shipped_kind} UDF, the plan calls a {kind} UDF")
    t = pa.ipc.read_schema(pa.py_buffer(schema)).field(0).type
    return udf_invoker(fn, kind, t, processes, life, concurrency, gpus)
