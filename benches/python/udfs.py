"""The UDF bodies every peer of the Python benchmark runs (benches/python.rs).

At module level, so worker processes (udfchain `processes=`, DataChain
`parallel=`, Daft `use_process=`) import them by name. A: hash every byte
with hashlib. C: a pure-Python CPU loop over the file's bytes,
`UDFCHAIN_BENCH_BURN_ROUNDS` times (the driver sets it so one call takes
about 20 ms on this machine). M: decode a JPEG with Pillow, RGB, resize to
224x224 and run the tiny ONNX classifier of `examples/python/tiny_cnn.py`
(at `UDFCHAIN_BENCH_MODEL`) over a batch of them; the peers' classes that
hold the model are in `m_udfchain.py`, `m_datachain.py` and `m_daft.py`
(one module per peer, so no run imports another peer), their bodies here.
The cluster benchmark's workload C-py (`cluster_driver.py`) runs C's
`burn_file` on Python executors, which import this module by name, and
`pid_file` to see which processes ran the calls.
"""

import hashlib
import os
import sys

ROUNDS = int(os.environ.get("UDFCHAIN_BENCH_BURN_ROUNDS", "1"))

# tiny_cnn (the model, its preprocessing, the synthetic photos) lives with the examples.
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python")
if os.path.normpath(EXAMPLES) not in map(os.path.normpath, sys.path):
    sys.path.append(os.path.normpath(EXAMPLES))


def sha_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def burn_bytes(data: bytes) -> int:
    h = 0
    for _ in range(ROUNDS):
        for b in data:
            h = (h * 31 + b) & 0xFFFFFFFF
    return h


def sha_file(file) -> str:
    return sha_bytes(file.read())


def burn_file(file) -> int:
    return burn_bytes(file.read())


def ident(x: int) -> int:
    return x


def pid_file(file) -> int:
    """The process that ran the call (the cluster benchmark's readiness probe)."""
    return os.getpid()


# ---------------------------------------------------------------------------
# M: the model


def load_model():
    """The ONNX session of `$UDFCHAIN_BENCH_MODEL` (one intra-op thread, see
    tiny_cnn.load), after appending this process's pid to the file named by
    `$UDFCHAIN_BENCH_MODEL_LOADS` (when set): the driver counts the lines to
    know how many times a run loaded the model."""
    import tiny_cnn

    log = os.environ.get("UDFCHAIN_BENCH_MODEL_LOADS")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
    return tiny_cnn.load(os.environ["UDFCHAIN_BENCH_MODEL"])


def classify_bytes(session, datas: list) -> list:
    """[(class, score)] of JPEG bytes: each decoded and resized, all through the model in one call."""
    import numpy as np
    import tiny_cnn

    if not datas:
        return []
    cls, score = tiny_cnn.top1(session, np.stack([tiny_cnn.decode(d) for d in datas]))
    return [(int(c), float(s)) for c, s in zip(cls, score)]


def pillow_mean_224(file) -> float:
    """Workload I with Pillow: decode, RGB, resize to 224x224 (bilinear), the
    mean of the pixels."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(file.read())) as im:
        return float(np.asarray(im.convert("RGB").resize((224, 224), Image.BILINEAR)).mean())
