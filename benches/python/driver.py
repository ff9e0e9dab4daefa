"""The Python peers of the Python benchmark (run by benches/python.rs).

    python driver.py all --workloads A,C [--quick]     # every peer, one JSON line per run
    python driver.py one PEER CONFIG WORKLOAD          # one run (a fresh interpreter each)
    python driver.py local-m DIR [--quick] [--files N] # M over a local dir, no S3 server

`--peers udfchain-py,daft` (or UDFCHAIN_BENCH_PEERS) runs only those.

The S3 server is the Rust harness's, on 127.0.0.1: UDFCHAIN_BENCH_ENDPOINT,
UDFCHAIN_BENCH_BUCKET and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_REGION in the environment; objects under a/ (workload A) and c/ (C).

Each run is its own interpreter (`one`), timed from building the chain to
having every row's value (listing included, imports not), so no peer reuses
another's warm pools. A peer that cannot be imported, or fails, gives a
record with `error` instead of a time. Nothing is asserted.

Workload M (model inference): UDFCHAIN_BENCH_M_DIR is the server's
directory of m/ (the bucket directory on this machine) and
UDFCHAIN_BENCH_M_FILES the number of JPEGs; before the timed runs `all`
writes that many photo-like 640x480 JPEGs there (~100 KB each,
`tiny_cnn.synthetic_photo`), builds the tiny ONNX classifier
(`examples/python/tiny_cnn.py`) and measures, in this one process over
local bytes, the CPU time per file of decoding + resizing and of inference
(batches of 32): the bound is cores / (decode + inference). Each peer then
decodes, resizes and classifies every file through the model in batches of
32 (DataChain 0.62 has no batched mapper: one image per call), loading the
model once per worker; every load appends a line to the run's
UDFCHAIN_BENCH_MODEL_LOADS file, counted into the record (`model_loads`
next to `workers`, the instances the settings ask for). Each M record also
carries its own bound, measured just before the run, and checks its values
against the model run directly on the bound's sample (`mismatches`).
`local-m DIR` does the same over a local directory, for trying the peers
without the Rust harness.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CORES = os.cpu_count() or 1
TIMEOUT = float(os.environ.get("UDFCHAIN_BENCH_RUN_TIMEOUT", "900"))

# (peer, config) -> settings, per workload. "defaults" sets nothing.
# M: `concurrency` is udfchain's per-UDF keyword (how many calls of the UDF
# at once), the rest are settings; Daft's are `@daft.cls` arguments.
CONFIGS = {
    "udfchain-py": {
        "defaults": {"A": {}, "C": {}, "M": {}},
        "best": {"A": {"prefetch": 64, "parallel": 4 * CORES}, "C": {"prefetch": 16, "processes": CORES},
                 "M": {"prefetch": 64, "concurrency": CORES}},
        # I, every row at udfchain's defaults: the native functions in SQL and
        # as chain expressions, and the Pillow UDF.
        "native-sql": {"I": {"path": "sql"}},
        "native-expr": {"I": {"path": "expr"}},
        "native-best": {"I": {"path": "expr", "prefetch": 64}},
        "pillow": {"I": {"path": "pillow"}},
        # I's training loader: decoded 224x224 batches from the local JPEGs.
        "loader": {"I": {"path": "loader"}},
    },
    # I's loader peer: a torchvision-style Dataset (Pillow decode + RGB +
    # resize per item) in 2 worker processes batching for a Python loop.
    "pillow-dataset": {
        "2-workers": {"I": {"workers": 2}},
    },
    "datachain": {
        "defaults": {"A": {}, "C": {}, "M": {}, "I": {}},
        "best": {"A": {"prefetch": 32, "parallel": CORES}, "C": {"prefetch": 16, "parallel": CORES},
                 "M": {"prefetch": 16, "parallel": CORES}, "I": {"prefetch": 16, "parallel": CORES}},
    },
    "daft": {
        "defaults": {"A": {}, "C": {}, "M": {}, "I": {}},
        "best": {"A": {}, "C": {"use_process": True}, "M": {"use_process": False}},
    },
}

M_BATCH = 32
M_SAMPLE = 64  # files of the bound's measurement and of each run's check


def env(name: str) -> str:
    v = os.environ.get(name)
    if not v:
        raise SystemExit(f"driver.py: {name} is not set (benches/python.rs sets it)")
    return v


def uri(workload: str) -> str:
    workload = "M" if workload == "I" else workload  # I reads M's JPEGs
    if workload == "M" and os.environ.get("UDFCHAIN_BENCH_M_SOURCE"):
        return os.environ["UDFCHAIN_BENCH_M_SOURCE"]  # local-m: a directory
    return f"s3://{env('UDFCHAIN_BENCH_BUCKET')}/{workload.lower()}/"


def workers_of(peer: str, settings: dict):
    """The copies of the model the settings ask for: udfchain one per worker
    process (in-process: one, shared by its `concurrency` calls at once),
    DataChain one per `parallel` process, Daft one per instance
    (`max_concurrency`; None: Daft's choice)."""
    if peer == "udfchain-py":
        return settings.get("processes") or 1
    if peer == "datachain":
        return settings.get("parallel") or 1
    return settings.get("max_concurrency")  # Daft: None, its own choice


# ---------------------------------------------------------------------------
# One run of one peer


def run_udfchain(config: dict, workload: str) -> list:
    import udfchain as uc
    import udfs

    if workload == "M":
        return run_udfchain_m(config)
    if workload == "I":
        return run_udfchain_i(config)
    c = uc.read_storage(uri(workload)).settings(storage=udfchain_storage())
    fn = udfs.sha_file if workload == "A" else udfs.burn_file
    if config:
        c = c.settings(**config)
    return c.map(out=fn).collect("out")


def udfchain_storage() -> dict:
    return {
        "endpoint": env("UDFCHAIN_BENCH_ENDPOINT"),
        "allow_http": True,
        "access_key_id": env("AWS_ACCESS_KEY_ID"),
        "secret_access_key": env("AWS_SECRET_ACCESS_KEY"),
        "region": env("AWS_REGION"),
        "virtual_hosted_style_request": False,
    }


def run_udfchain_m(config: dict) -> list:
    """M: the class BatchMapper of m_udfchain (setup loads the model once per worker)."""
    import udfchain as uc
    import m_udfchain

    src = uri("M")
    c = uc.read_storage(src)
    if src.startswith("s3://"):
        c = c.settings(storage=udfchain_storage())
    settings = {k: v for k, v in config.items() if k != "concurrency"}
    if settings:
        c = c.settings(**settings)
    kw = {"concurrency": config["concurrency"]} if "concurrency" in config else {}
    rows = c.batch_map(label=m_udfchain.Classify(), batch_size=M_BATCH, **kw).collect("file", "label")
    return [(f.path, lab["cls"], lab["score"]) for f, lab in rows]


I_SIZE = 224


def means(flat: "np.ndarray", rows: int) -> list:
    """One number per image: the mean of its pixels (rows of a flat buffer)."""
    return [float(m) for m in flat.reshape(rows, -1).mean(axis=1)] if rows else []


def run_udfchain_i(config: dict) -> list:
    """I: decode, RGB, resize to 224x224, the mean per image; `path` says how:
    the native functions in SQL or as expressions, or Pillow in a map UDF."""
    import numpy as np
    import udfchain as uc
    import udfs

    if config["path"] == "loader":
        return run_loader_i()
    src, path = uri("I"), config["path"]
    storage = udfchain_storage() if src.startswith("s3://") else None
    if path == "pillow":
        c = uc.read_storage(src)
        if storage:
            c = c.settings(storage=storage)
        return c.map(m=udfs.pillow_mean_224).collect("m")
    if path == "sql":
        if storage:
            uc.run("".join(f"SET storage.{k} = '{str(v).lower() if isinstance(v, bool) else v}';" for k, v in storage.items()))
        t = uc.query(f"SELECT image_resize(image_convert(image_decode(file), 'RGB'), {I_SIZE}, {I_SIZE}, 'bilinear') AS img "
                     f"FROM read_storage('{src}')").to_pyarrow()
    else:
        f = uc.func
        c = uc.read_storage(src)
        if storage:
            c = c.settings(storage=storage)
        if "prefetch" in config:
            # A file-reading built-in in an expression runs under the
            # session's settings (the runner's): SET them there.
            uc.run(f"SET prefetch = {config['prefetch']}")
        img = f.image_resize(f.image_convert(f.image_decode("file"), "RGB"), I_SIZE, I_SIZE, "bilinear")
        t = c.select(img=img).to_pyarrow()
    data = t.column("img").combine_chunks().field("data")
    if not len(data):
        return []
    offsets = np.frombuffer(data.buffers()[1], np.int32)[data.offset:data.offset + len(data) + 1]
    flat = np.frombuffer(data.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
    return means(flat, len(data))


def run_datachain(config: dict, workload: str) -> list:
    if uri(workload).startswith("s3://"):
        os.environ["AWS_ENDPOINT_URL"] = env("UDFCHAIN_BENCH_ENDPOINT")
    # DataChain's `parallel=` runs its workers with PYTHONPATH set to the
    # current directory (and nothing else), as for a user's script run from
    # their project: run from the directory of `udfs`, with DataChain's
    # root kept where it was (the harness sets DATACHAIN_ROOT_DIR).
    os.environ.setdefault("DATACHAIN_ROOT_DIR", os.path.join(os.getcwd(), ".datachain"))
    os.chdir(HERE)
    import datachain as dc
    import udfs

    c = dc.read_storage(uri(workload), update=True)
    if config:
        c = c.settings(**config)
    if workload == "I":
        return c.map(m=udfs.pillow_mean_224).to_values("m")
    if workload == "M":
        # A Mapper with setup (one model per worker process), one image per call.
        import m_datachain

        c = c.map(m_datachain.Classify(), params=["file"], output={"cls": int, "score": float})
        return c.to_list("file.path", "cls", "score")
    fn = udfs.sha_file if workload == "A" else udfs.burn_file
    return c.map(out=fn).to_values("out")


def run_daft(config: dict, workload: str) -> list:
    import daft
    from daft.io import IOConfig, S3Config
    import udfs

    if workload in ("M", "I") and not uri("M").startswith("s3://"):
        io = None
    else:
        io = IOConfig(
            s3=S3Config(
                endpoint_url=env("UDFCHAIN_BENCH_ENDPOINT"),
                key_id=env("AWS_ACCESS_KEY_ID"),
                access_key=env("AWS_SECRET_ACCESS_KEY"),
                region_name=env("AWS_REGION"),
                use_ssl=False,
            )
        )
    if workload == "M":
        # `@daft.cls(**config)` over m_daft.Classify: __init__ loads the
        # model once per instance, a batch method of 32 rows runs it.
        import m_daft

        model = daft.cls(m_daft.Classify, **config)()
        df = daft.from_glob_path(f"{uri('M').rstrip('/')}/**", io_config=io)
        df = df.with_column("bytes", daft.functions.download(df["path"], io_config=io))
        df = df.with_column("label", model.classify(df["bytes"]))
        out = df.select("path", "label").to_pydict()
        return [(p, lab["cls"], lab["score"]) for p, lab in zip(out["path"], out["label"])]
    if workload == "I":
        # Daft's native decode and resize, then the mean per image over the
        # fixed-shape result (one numpy pass, as udfchain's native rows).
        import numpy as np

        df = daft.from_glob_path(f"{uri('I').rstrip('/')}/**", io_config=io)
        b = daft.functions.download(df["path"], io_config=io)
        df = df.with_column("img", b.decode_image(mode="RGB").resize(I_SIZE, I_SIZE) if hasattr(b, "decode_image")
                            else b.image.decode(mode="RGB").image.resize(I_SIZE, I_SIZE))
        col = df.select("img").to_arrow().column("img").combine_chunks()
        storage = col.storage if hasattr(col, "storage") else col
        return means(np.asarray(storage.flatten().to_numpy(zero_copy_only=False), np.uint8), len(storage))
    body = udfs.sha_bytes if workload == "A" else udfs.burn_bytes
    out = str if workload == "A" else int
    fn = daft.func(body, return_dtype=out, **config)
    df = daft.from_glob_path(f"{uri(workload)}**", io_config=io)
    df = df.with_column("bytes", daft.functions.download(df["path"], io_config=io))
    df = df.with_column("out", fn(df["bytes"]))
    return df.select("out").to_pydict()["out"]


I_BATCH = 32


def run_loader_i() -> list:
    """I's loader row: `uc.Loader` over the local JPEGs with `with_images`
    (224x224 RGB, decoded on the engine's threads partitions ahead), a
    Python loop taking each batch's (N, H, W, C) array; the mean per image."""
    import udfchain as uc

    chain = uc.read_storage(env("UDFCHAIN_BENCH_M_DIR").rstrip("/") + "/")
    loader = uc.Loader(chain, batch_size=I_BATCH, with_images={"size": (I_SIZE, I_SIZE)})
    values = []
    for batch in loader:
        images = batch["image"]
        values.extend(float(m) for m in images.reshape(len(images), -1).mean(axis=1))
    return values


def _pillow_item(path: str):
    """A torchvision-style `Dataset.__getitem__`: Pillow decode, RGB, resize."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB").resize((I_SIZE, I_SIZE), Image.BILINEAR))


def _pillow_batch(paths: list):
    """A DataLoader worker's batch: items stacked (its default collate)."""
    import numpy as np

    return np.stack([_pillow_item(p) for p in paths])


def run_pillow_dataset(config: dict, workload: str) -> list:
    """I's loader peer: torch's DataLoader(num_workers=2) over a Pillow
    Dataset when torch imports; without torch the same shape of work, a
    pool of `workers` processes making batches (decode + RGB + resize +
    stack) that come back pickled to this loop, `workers` batches ahead."""
    import multiprocessing as mp

    d = env("UDFCHAIN_BENCH_M_DIR")
    paths = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".jpg"))
    workers = config.get("workers", 2)
    values = []

    def take(images):
        values.extend(float(m) for m in images.reshape(len(images), -1).mean(axis=1))

    try:
        import torch
        from torch.utils.data import DataLoader, Dataset
    except Exception:
        torch = None
    if torch is not None:
        class Files(Dataset):
            def __len__(self):
                return len(paths)

            def __getitem__(self, i):
                return torch.from_numpy(_pillow_item(paths[i]).copy())

        for images in DataLoader(Files(), batch_size=I_BATCH, num_workers=workers):
            take(images.numpy())
        return values
    batches = [paths[i:i + I_BATCH] for i in range(0, len(paths), I_BATCH)]
    with mp.get_context("fork").Pool(workers) as pool:
        for images in pool.imap(_pillow_batch, batches, chunksize=1):
            take(images)
    return values


RUNNERS = {"udfchain-py": run_udfchain, "datachain": run_datachain, "daft": run_daft,
           "pillow-dataset": run_pillow_dataset}


def one(peer: str, config: str, workload: str) -> dict:
    settings = CONFIGS[peer][config][workload]
    rec = {"peer": peer, "config": config, "workload": workload, "settings": settings}
    # Imports before the clock: each peer's import time is not the workload's.
    try:
        if peer == "udfchain-py":
            import udfchain  # noqa: F401
        elif peer == "datachain":
            import datachain  # noqa: F401
        elif peer == "pillow-dataset":
            import numpy  # noqa: F401
            import PIL  # noqa: F401
        else:
            import daft  # noqa: F401
    except Exception as e:
        rec["error"] = f"cannot import {peer}: {type(e).__name__}: {e}"
        return rec
    try:
        import importlib.metadata as md

        rec["version"] = md.version({"udfchain-py": "udfchain", "pillow-dataset": "pillow"}.get(peer, peer))
    except Exception:
        rec["version"] = None  # imported from a source tree (no package metadata)
    if workload == "C":
        # This run's own t_udf, measured just before it: the machine's speed
        # moves between runs, so a bound measured seconds apart can be 1.5x off.
        import udfs

        data = bytes(i % 251 for i in range(int(env("UDFCHAIN_BENCH_C_SIZE"))))
        rec["t_udf_seconds"] = min(_timed(udfs.burn_bytes, data) for _ in range(3))
        rec["bound_files_per_s"] = CORES / rec["t_udf_seconds"]
    reference = None
    if workload == "M":
        # The same for M (decode + inference CPU per file, just before the
        # run), and the sample's classes to check the run's values against.
        bound = measure_m(env("UDFCHAIN_BENCH_M_DIR"), env("UDFCHAIN_BENCH_MODEL"), M_SAMPLE)
        reference = bound.pop("reference")
        rec.update({k: bound[k] for k in ("decode_cpu_s_per_file", "infer_cpu_s_per_file", "bound_files_per_s")})
        rec["workers"] = workers_of(peer, settings)
        fd, loads = tempfile.mkstemp(prefix=f"model-loads-{peer}-{config}-", suffix=".txt")
        os.close(fd)
        os.environ["UDFCHAIN_BENCH_MODEL_LOADS"] = loads  # before any worker starts: they inherit it
    t0 = time.perf_counter()
    try:
        values = RUNNERS[peer](settings, workload)
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        return rec
    rec["seconds"] = time.perf_counter() - t0
    rec["files"] = len(values)
    rec["files_per_s"] = len(values) / rec["seconds"]
    if workload == "I":
        rec["distinct_values"] = len({round(v, 3) for v in values})
        rec["invalid_values"] = sum(1 for v in values if not (0 <= v <= 255))
    if workload == "M":
        rec.update(check_m(values, reference))
        with open(loads) as f:
            pids = [line.strip() for line in f if line.strip()]
        os.unlink(loads)
        rec["model_loads"] = len(pids)
        rec["model_load_processes"] = len(set(pids))
        rec["over_bound"] = rec["files_per_s"] / rec["bound_files_per_s"]
    else:
        rec["distinct_values"] = len(set(values))
    return rec


def check_m(values: list, reference: dict) -> dict:
    """M's values [(path, class, score)]: how many are out of range, and how
    many of the sample's differ from the model run directly (a class, or a
    score by more than 1e-4: batches of other sizes may round differently)."""
    bad = sum(1 for _, c, s in values if not (isinstance(c, int) and 0 <= c < 1000 and 0 < s <= 1))
    by_name = {os.path.basename(str(p)): (c, s) for p, c, s in values}
    checked = mismatches = 0
    for name, (c, s) in reference.items():
        got = by_name.get(name)
        if got is None:
            continue
        checked += 1
        if got[0] != c or abs(got[1] - s) > 1e-4:
            mismatches += 1
    return {"distinct_values": len({c for _, c, _ in values}), "invalid_values": bad,
            "checked": checked, "mismatches": mismatches, "distinct_paths": len(by_name)}


def measure_m(directory: str, model: str, sample: int, repeats: int = 3) -> dict:
    """CPU seconds per file, in this process over local bytes (the first
    `sample` files of `directory`, read before the clock), of decode +
    resize (`tiny_cnn.decode`) and of inference in batches of 32 and of 1;
    the best of `repeats` passes; the bound cores / (decode + inference);
    and the sample's (class, score) by file name."""
    import numpy as np
    import udfs  # noqa: F401  (puts tiny_cnn on sys.path)
    import tiny_cnn

    names = sorted(n for n in os.listdir(directory) if n.endswith(".jpg"))[:sample]
    datas = []
    for n in names:
        with open(os.path.join(directory, n), "rb") as f:
            datas.append(f.read())
    session = tiny_cnn.load(model)
    tiny_cnn.top1(session, np.stack([tiny_cnn.decode(d) for d in datas[:M_BATCH]]))  # warm
    dec = inf = inf1 = float("inf")
    wall_dec = wall_inf = float("inf")
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        x = np.stack([tiny_cnn.decode(d) for d in datas])
        c1, w1 = time.process_time(), time.perf_counter()
        results = [tiny_cnn.top1(session, x[i:i + M_BATCH]) for i in range(0, len(x), M_BATCH)]
        c2, w2 = time.process_time(), time.perf_counter()
        for i in range(min(16, len(x))):
            tiny_cnn.top1(session, x[i:i + 1])
        c3 = time.process_time()
        dec, inf = min(dec, (c1 - c0) / len(x)), min(inf, (c2 - c1) / len(x))
        inf1 = min(inf1, (c3 - c2) / min(16, len(x)))
        wall_dec, wall_inf = min(wall_dec, (w1 - w0) / len(x)), min(wall_inf, (w2 - w1) / len(x))
    cls = np.concatenate([r[0] for r in results])
    score = np.concatenate([r[1] for r in results])
    return {
        "sample_files": len(datas),
        "sample_mean_bytes": sum(map(len, datas)) / max(1, len(datas)),
        "decode_cpu_s_per_file": dec,
        "infer_cpu_s_per_file": inf,
        "infer_batch1_cpu_s_per_file": inf1,
        "decode_wall_s_per_file": wall_dec,
        "infer_wall_s_per_file": wall_inf,
        "cores": CORES,
        "bound_files_per_s": CORES / (dec + inf),
        "bound_batch1_files_per_s": CORES / (dec + inf1),
        "reference": {n: (int(c), float(s)) for n, c, s in zip(names, cls, score)},
    }


def _m_loop(args) -> tuple[int, float]:
    """The bare M loop (read before the clock; decode, stack, infer per 32),
    `rounds` times over `names`: (files, seconds)."""
    directory, model, names, rounds, session = args
    import numpy as np
    import udfs  # noqa: F401
    import tiny_cnn

    session = session or tiny_cnn.load(model)
    datas = []
    for n in names:
        with open(os.path.join(directory, n), "rb") as f:
            datas.append(f.read())
    tiny_cnn.top1(session, np.stack([tiny_cnn.decode(d) for d in datas[:2]]))
    t0 = time.perf_counter()
    for _ in range(rounds):
        for i in range(0, len(datas), M_BATCH):
            tiny_cnn.top1(session, np.stack([tiny_cnn.decode(d) for d in datas[i:i + M_BATCH]]))
    return len(datas) * rounds, time.perf_counter() - t0


def machine_parallel_m(directory: str, model: str, sample: int) -> dict:
    """Files/s of M's bare loop, no engine and no I/O: in one thread; in
    `CORES` threads of one process sharing one session (what in-process
    concurrency can get: Pillow, numpy and onnxruntime release the GIL for
    most of their work); in `CORES` spawned processes (a session each)."""
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    import udfs  # noqa: F401
    import tiny_cnn

    # Each loop times itself (after its model load, reads and warm-up); the
    # loops run at once, so the rate is their files over the slowest one.
    names = sorted(n for n in os.listdir(directory) if n.endswith(".jpg"))[:sample]
    rounds = 3

    def rate(results) -> float:
        return sum(f for f, _ in results) / max(s for _, s in results)

    one = rate([_m_loop((directory, model, names, rounds, None))])
    session = tiny_cnn.load(model)
    with ThreadPoolExecutor(CORES) as pool:
        threads = rate(list(pool.map(_m_loop, [(directory, model, names, rounds, session)] * CORES)))
    with multiprocessing.get_context("spawn").Pool(CORES) as pool:
        pool.map(_m_loop, [(directory, model, names[:2], 1, None)] * CORES)  # started
        procs = rate(pool.map(_m_loop, [(directory, model, names, rounds, None)] * CORES))
    return {"bare_loop_files_per_s": one, "bare_loop_threads_files_per_s": threads,
            "bare_loop_processes_files_per_s": procs}


def prepare_m(directory: str, files: int, model: str) -> dict:
    """Writes the M JPEGs (unless `directory` already holds exactly them) and the model."""
    import udfs  # noqa: F401
    import tiny_cnn

    t0 = time.perf_counter()
    want = [f"img{i:05}.jpg" for i in range(files)]
    have = sorted(n for n in os.listdir(directory) if n.endswith(".jpg")) if os.path.isdir(directory) else []
    written = 0 if have == want else tiny_cnn.write_jpegs(directory, files, processes=CORES)
    total = sum(os.path.getsize(os.path.join(directory, n)) for n in want)
    tiny_cnn.build(model)
    # The files just written are flushed before the timed runs, so the
    # first run does not share the machine with their write-back.
    os.sync()
    return {"workload": "M", "prepare": True, "files": files, "bytes": total, "mean_bytes": total / max(1, files),
            "written_bytes": written, "seconds": time.perf_counter() - t0, "model": model,
            "model_bytes": os.path.getsize(model)}


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
        workloads = [w.strip().upper() for w in args[args.index("--workloads") + 1].split(",") if w.strip()]
    if args and args[0] == "local-m":
        # M over a local directory (no S3 server, no Rust harness).
        if len(args) < 2 or args[1].startswith("-"):
            raise SystemExit("usage: driver.py local-m DIR [--quick] [--files N] [--peers P,Q]")
        d = os.path.abspath(args[1])
        files = int(args[args.index("--files") + 1]) if "--files" in args else (300 if quick else 2000)
        os.environ["UDFCHAIN_BENCH_M_DIR"] = d
        os.environ["UDFCHAIN_BENCH_M_FILES"] = str(files)
        os.environ["UDFCHAIN_BENCH_M_SOURCE"] = d + "/"
        workloads = ["M"]
    peers = os.environ.get("UDFCHAIN_BENCH_PEERS", ",".join(RUNNERS)).split(",")
    if "--peers" in args:
        peers = args[args.index("--peers") + 1].split(",")
    child_env = dict(os.environ)
    # DataChain reuses a UDF's results from the previous run of the same
    # script ("checkpoints", keyed by the UDF's code and input, not by its
    # settings): every run after the first of a workload would read the
    # first's results instead of computing them.
    child_env["DATACHAIN_IGNORE_CHECKPOINTS"] = "1"
    # Daft's process workers import `udfs` by name from a fresh interpreter
    # that does not inherit sys.path (multiprocessing's spawn does).
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    if "M" in workloads or "I" in workloads:
        model = os.path.abspath(os.environ.get("UDFCHAIN_BENCH_MODEL") or "tiny_cnn.onnx")
        child_env["UDFCHAIN_BENCH_MODEL"] = model
        print(json.dumps(prepare_m(env("UDFCHAIN_BENCH_M_DIR"), int(env("UDFCHAIN_BENCH_M_FILES")), model)),
              flush=True)
    if "M" in workloads:  # I reads M's JPEGs; its bound is measured by the harness
        bound = measure_m(env("UDFCHAIN_BENCH_M_DIR"), model, M_SAMPLE)
        bound.pop("reference")
        bound.update(machine_parallel_m(env("UDFCHAIN_BENCH_M_DIR"), model, M_SAMPLE))
        print(json.dumps({"workload": "M", "bound": True, **bound}), flush=True)
    if "C" in workloads:
        size = int(env("UDFCHAIN_BENCH_C_SIZE"))
        rounds, t_udf = calibrate(size)
        child_env["UDFCHAIN_BENCH_BURN_ROUNDS"] = str(rounds)
        print(json.dumps({"workload": "C", "calibration": True, "burn_rounds": rounds, "t_udf_seconds": t_udf,
                          "cores": CORES, "machine_parallel_files_per_s": machine_parallel(rounds, size, 40 if quick else 120)}),
              flush=True)
    if "A" in workloads or "C" in workloads:
        print(json.dumps(trivial_map(50_000 if quick else 200_000)), flush=True)
    for workload in workloads:
        if workload not in ("A", "C", "M", "I"):
            print(json.dumps({"workload": workload, "error": "unknown workload (A, C, M or I)"}), flush=True)
            continue
        runs = [(peer, config) for peer in peers
                for config in [c for c, w in CONFIGS.get(peer, {}).items() if workload in w]]

        def command(peer: str, config: str) -> list:
            return [sys.executable, os.path.abspath(__file__), "one", peer, config, workload]

        # One untimed run first: the first run after the files were written
        # paid the server's and the OS's first touches (measured: the first
        # udfchain row of I 15% slower than the same row second).
        for peer, config in runs[:1]:
            try:
                subprocess.run(command(peer, config), capture_output=True, env=child_env, timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                pass  # the timed run says so
        for peer, config in runs:
            cmd = command(peer, config)
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
