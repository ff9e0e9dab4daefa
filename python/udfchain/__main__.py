"""`python -m udfchain cluster executor|scheduler`: the cluster's processes
from the Python package (see `udfchain.cluster`). Exit status 0 when the
process is stopped, 1 with the error on stderr when it cannot start, 130 at
Ctrl-C."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m udfchain", description="udfchain from the Python package")
    sub = p.add_subparsers(dest="command", required=True)
    cluster = sub.add_parser("cluster", help="a cluster process").add_subparsers(dest="process", required=True)
    ex = cluster.add_parser(
        "executor",
        help="run an executor that runs Python UDFs (and the Rust built-ins)",
        epilog="example: python -m udfchain cluster executor --scheduler 10.0.0.5:50050 --slots 4 --work-dir /data/e1",
    )
    ex.add_argument("--scheduler", default="127.0.0.1:50050", help="the scheduler's HOST:PORT")
    ex.add_argument("--slots", type=int, default=None, help="tasks run at once (default: the number of cores)")
    ex.add_argument("--work-dir", default=None, help="shuffle files, temp caches, the shared cache")
    ex.add_argument("--host", default="127.0.0.1", help="the address other nodes reach this executor at")
    ex.add_argument("--port", type=int, default=0, help="its Arrow Flight port (default: a free one)")
    sc = cluster.add_parser("scheduler", help="run a scheduler (as `udfchain cluster scheduler`)")
    sc.add_argument("--bind", default="127.0.0.1:50050", help="the address to listen on")
    args = p.parse_args(argv)

    from . import UdfchainError, cluster as c

    try:
        if args.process == "executor":
            if args.slots is not None and args.slots < 1:
                p.error("--slots must be at least 1")
            c.executor(args.scheduler, args.slots, args.work_dir, args.host, args.port)
        else:
            print(f"udfchain: scheduler listening on {args.bind}", file=sys.stderr)
            c.scheduler(args.bind)
    except KeyboardInterrupt:
        return 130
    except UdfchainError as e:
        print(f"udfchain: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
