"""Python chains on a Ballista cluster: the executor that runs Python UDFs.

    udfchain cluster scheduler --bind 0.0.0.0:50050               # the Rust binary
    python -m udfchain cluster executor --scheduler HOST:50050 --slots 4 --work-dir /data/e1

and on the client, one setting (or `uc.connect("df://HOST:50050")`):

    uc.read_storage("s3://bucket/images/").settings(cluster="df://HOST:50050", workers=4).map(...).save("x")

A Python executor is a udfchain executor (the same operators, prefetch and
Rust built-ins) inside a Python process, which also runs the Python UDFs a
plan carries as code (`_ship`: by module and name, or by value with
cloudpickle). A UDF's state (a class UDF's `setup()`, `Chain.setup` values)
is built once per executor process (and once per worker process under
`processes=`). See docs/cluster.md, "Python chains".
"""

from __future__ import annotations

import os

from . import _internal


def executor(
    scheduler: str = "127.0.0.1:50050",
    slots: int | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> None:
    """Runs a Python executor until the process ends, Ctrl-C or the
    scheduler stops it: `scheduler` is its HOST:PORT (or df://HOST:PORT);
    `slots` the tasks it runs at once (default: the number of cores);
    `work_dir` where shuffle files, temp caches and the shared cache go
    (default `<root>/executor`); `host` the address other nodes reach it at;
    `port` its Arrow Flight port (default: a free one). Raises when it cannot
    start (no scheduler within 10 s, a bad address)."""
    _internal.cluster_executor(
        scheduler, slots, os.fspath(work_dir) if work_dir is not None else None, host, port
    )


def scheduler(bind: str = "127.0.0.1:50050") -> None:
    """Runs a scheduler on `bind` (HOST:PORT) until the process ends or
    Ctrl-C: the same as `udfchain cluster scheduler`, for machines with only
    the Python package."""
    _internal.cluster_scheduler(bind)
