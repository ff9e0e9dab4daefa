"""The Python peers of the Python benchmark (run by benches/python.rs).

    python driver.py all --workloads A,C [--quick]     # every peer, one JSON line per run
    python driver.py one PEER CONFIG WORKLOAD          # one run (a fresh interpreter each)

`--peers udfchain-py,daft` (or UDFCHAIN_BENCH_PEERS) runs only those.

The S3 server is the Rust harness's, on 127.0.0.1: UDFCHAIN_BENCH_ENDPOINT,
UDFCHAIN_BENCH_BUCKET and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_REGION in the environment; objects under a/ (workload A) and c/ (C).
Each run is its own interpreter (`one`), timed from building the chain to
having every row's value (listing included, imports not), so no peer reuses
another's warm pools. A peer that cannot be imported, or fails, gives a
record with `error` instead of a time. Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CORES = os.cpu_count() or 1
TIMEOUT = float(os.environ.get("UDFCHAIN_BENCH_RUN_TIMEOUT", "900"))

# (peer, config) -> settings, per workload. "defaults" sets nothing.
CONFIGS = {
    "udfchain-py": {
        "defaults": {"A": {}, "C": {}},
        "best": {"A": {"prefetch": 64, "parallel": 4 * CORES}, "C": {"prefetch": 16, "processes": CORES}},
    },
    "datachain": {
        "defaults": {"A": {}, "C": {}},
        "best": {"A": {"prefetch": 32, "parallel": CORES}, "C": {"prefetch": 16, "parallel": CORES}},
    },
    "daft": {
        "defaults": {"A": {}, "C": {}},
        "best": {"A": {}, "C": {"use_process": True}},
    },
}


def env(name: str) -> str:
    v = os.environ.get(name)
    if not v:
        raise SystemExit(f"driver.py: {name} is not set (benches/python.rs sets it)")
    return v


def uri(workload: str) -> str:
    return f"s3://{env('UDFCHAIN_BENCH_BUCKET')}/{workload.lower()}/"


# ---------------------------------------------------------------------------
# One run of one peer


def run_udfchain(config: dict, workload: str) -> list:
    import udfchain as uc
    import udfs

    storage = {
        "endpoint": env("UDFCHAIN_BENCH_ENDPOINT"),
        "allow_http": True,
        "access_key_id": env("AWS_ACCESS_KEY_ID"),
        "secret_access_key": env("AWS_SECRET_ACCESS_KEY"),
        "region": env("AWS_REGION"),
        "virtual_hosted_style_request": False,
    }
    fn = udfs.sha_file if workload == "A" else udfs.burn_file
    c = uc.read_storage(uri(workload)).settings(storage=storage)
    if config:
        c = c.settings(**config)
    return c.map(out=fn).collect("out")


def run_datachain(config: dict, workload: str) -> list:
    os.environ["AWS_ENDPOINT_URL"] = env("UDFCHAIN_BENCH_ENDPOINT")
    import datachain as dc
    import udfs

    fn = udfs.sha_file if workload == "A" else udfs.burn_file
    c = dc.read_storage(uri(workload), update=True)
    if config:
        c = c.settings(**config)
    return c.map(out=fn).to_values("out")


def run_daft(config: dict, workload: str) -> list:
    import daft
    from daft.io import IOConfig, S3Config
    import udfs

    io = IOConfig(
        s3=S3Config(
            endpoint_url=env("UDFCHAIN_BENCH_ENDPOINT"),
            key_id=env("AWS_ACCESS_KEY_ID"),
            access_key=env("AWS_SECRET_ACCESS_KEY"),
            region_name=env("AWS_REGION"),
            use_ssl=False,
        )
    )
    body = udfs.sha_bytes if workload == "A" else udfs.burn_bytes
    out = str if workload == "A" else int
    fn = daft.func(body, return_dtype=out, **config)
    df = daft.from_glob_path(f"{uri(workload)}**", io_config=io)
    df = df.with_column("bytes", daft.functions.download(df["path"], io_config=io))
    df = df.with_column("out", fn(df["bytes"]))
    return df.select("out").to_pydict()["out"]


RUNNERS = {"udfchain-py": run_udfchain, "datachain": run_datachain, "daft": run_daft}


def one(peer: str, config: str, workload: str) -> dict:
    settings = CONFIGS[peer][config][workload]
    rec = {"peer": peer, "config": config, "workload": workload, "settings": settings}
    # Imports before the clock: each peer's import time is not the workload's.
    try:
        if peer == "udfchain-py":
            import udfchain  # noqa: F401
        elif peer == "datachain":
            import datachain  # noqa: F401
        else:
            import daft  # noqa: F401
    except Exception as e:
        rec["error"] = f"cannot import {peer}: {type(e).__name__}: {e}"
        return rec
    try:
        import importlib.metadata as md

        rec["version"] = md.version({"udfchain-py": "udfchain"}.get(peer, peer))
    except Exception:
        rec["version"] = None  # imported from a source tree (no package metadata)
    if workload == "C":
        # This run's own t_udf, measured just before it: the machine's speed
        # moves between runs, so a bound measured seconds apart can be 1.5x off.
        import udfs

        data = bytes(i % 251 for i in range(int(env("UDFCHAIN_BENCH_C_SIZE"))))
        rec["t_udf_seconds"] = min(_timed(udfs.burn_bytes, data) for _ in range(3))
        rec["bound_files_per_s"] = CORES / rec["t_udf_seconds"]
    t0 = time.perf_counter()
    try:
        values = RUNNERS[peer](settings, workload)
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        return rec
    rec["seconds"] = time.perf_counter() - t0
    rec["files"] = len(values)
    rec["files_per_s"] = len(values) / rec["seconds"]
    rec["distinct_values"] = len(set(values))
    return rec


# ---------------------------------------------------------------------------
# Calibration and the trivial map's overhead (in this interpreter)


def calibrate(size: int) -> tuple[int, float]:
    """Burn rounds for ~20 ms per call on `size` bytes, and the measured t_udf."""
    import udfs

    data = bytes(i % 251 for i in range(size))
    t0 = time.perf_counter()
    udfs.ROUNDS = 1
    udfs.burn_bytes(data)
    per_round = max(time.perf_counter() - t0, 1e-6)
    rounds = max(1, round(0.020 / per_round))
    udfs.ROUNDS = rounds
    best = min(_timed(udfs.burn_bytes, data) for _ in range(5))
    return rounds, best


def _burn_n(args) -> float:
    rounds, size, n = args
    import udfs

    udfs.ROUNDS = rounds
    data = bytes(i % 251 for i in range(size))
    for _ in range(n):
        udfs.burn_bytes(data)
    return 0.0


def machine_parallel(rounds: int, size: int, files: int) -> float:
    """Files/s of C's bare loop in `CORES` processes at once, no engine: what
    this machine gives N processes (on a VM they rarely get N times one)."""
    import multiprocessing

    per = max(1, files // CORES)
    with multiprocessing.get_context("spawn").Pool(CORES) as pool:
        pool.map(_burn_n, [(rounds, size, 1)] * CORES)  # started and warm
        t0 = time.perf_counter()
        pool.map(_burn_n, [(rounds, size, per)] * CORES)
        return per * CORES / (time.perf_counter() - t0)


def _timed(f, *a) -> float:
    t0 = time.perf_counter()
    f(*a)
    return time.perf_counter() - t0


def trivial_map(rows: int) -> dict:
    """µs per row of `map(y=ident)` over the same rows as the SQL expression `x`."""
    import udfchain as uc
    import udfs

    c = uc.read_values(x=list(range(rows)))
    sql = min(_timed(lambda: c.mutate(y=uc.C("x")).to_pyarrow()) for _ in range(3))
    py = min(_timed(lambda: c.map(y=udfs.ident).to_pyarrow()) for _ in range(3))
    return {
        "peer": "udfchain-py",
        "workload": "T",
        "rows": rows,
        "sql_seconds": sql,
        "python_map_seconds": py,
        "us_per_row_over_rust": (py - sql) / rows * 1e6,
    }


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "one":
        print(json.dumps(one(sys.argv[2], sys.argv[3], sys.argv[4])), flush=True)
        return
    args = sys.argv[1:]
    quick = "--quick" in args
    workloads = ["A", "C"]
    if "--workloads" in args:
        workloads = args[args.index("--workloads") + 1].split(",")
    peers = os.environ.get("UDFCHAIN_BENCH_PEERS", ",".join(RUNNERS)).split(",")
    if "--peers" in args:
        peers = args[args.index("--peers") + 1].split(",")
    child_env = dict(os.environ)
    # Daft's process workers import `udfs` by name from a fresh interpreter
    # that does not inherit sys.path (multiprocessing's spawn does).
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    if "C" in workloads:
        size = int(env("UDFCHAIN_BENCH_C_SIZE"))
        rounds, t_udf = calibrate(size)
        child_env["UDFCHAIN_BENCH_BURN_ROUNDS"] = str(rounds)
        print(json.dumps({"workload": "C", "calibration": True, "burn_rounds": rounds, "t_udf_seconds": t_udf,
                          "cores": CORES, "machine_parallel_files_per_s": machine_parallel(rounds, size, 40 if quick else 120)}),
              flush=True)
    print(json.dumps(trivial_map(50_000 if quick else 200_000)), flush=True)
    for workload in workloads:
        for peer in peers:
            for config in ("defaults", "best"):
                cmd = [sys.executable, os.path.abspath(__file__), "one", peer, config, workload]
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env, timeout=TIMEOUT)
                    line = p.stdout.strip().splitlines()[-1:] or [""]
                    try:
                        rec = json.loads(line[0])
                    except json.JSONDecodeError:
                        rec = {"peer": peer, "config": config, "workload": workload,
                               "error": f"exit {p.returncode}: {p.stderr.strip()[-500:]}"}
                except subprocess.TimeoutExpired:
                    rec = {"peer": peer, "config": config, "workload": workload,
                           "error": f"no result within {TIMEOUT:.0f} s"}
                print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
