#!/usr/bin/env python3
"""A tiny image classifier in ONNX, built here from random weights (nothing
is downloaded): the model of `classify.py`, of benchmark M
(`benches/python/`) and of `python/tests/test_models_onnx.py`.

    import tiny_cnn
    path = tiny_cnn.build("/tmp/tiny_cnn.onnx")     # writes the file (~0.3 MB)
    session = tiny_cnn.load(path)                   # onnxruntime, CPU, one thread
    x = np.stack([tiny_cnn.preprocess(im) for im in images])   # (N, 3, 224, 224)
    probs = session.run(None, {"input": x})[0]      # (N, 1000), rows sum to 1

The network: input `input` float32 [N, 3, 224, 224] (NCHW, N dynamic) ->
3 x (Conv 3x3 stride 2 + Relu: 16, 32, 64 channels; 224 -> 112 -> 56 -> 28)
-> GlobalAveragePool -> Flatten -> Gemm to 1,000 classes -> Softmax ->
output `probs` [N, 1000]. About 70 MFLOP per image: about 1 ms per image on
one CPU thread in batches of 32, next to about 5 ms to decode and resize a
640x480 JPEG, so a pipeline over it needs the cores for both, as a real one
does (with a bigger model the share of inference grows).

The weights come from numpy with a fixed seed (He initialisation; the last
layer calibrated, see `model_proto`), so every build gives the same outputs.
The classes mean nothing; what matters for a data engine is the shape of
the work. Building needs onnx, onnxruntime, Pillow and numpy; running it,
onnxruntime, Pillow and numpy. `synthetic_photo` / `write_jpegs` make
photo-like JPEGs to run it on.

Module-level functions only, so worker processes (udfchain `processes=`,
DataChain `parallel=`, Daft `use_process=`) can import them by name.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

INPUT = "input"
OUTPUT = "probs"
SIZE = 224
CLASSES = 1000
CHANNELS = (16, 32, 64)
SEED = 20261206

# ImageNet's per-channel mean and standard deviation (of pixels in [0, 1]).
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


def _features_proto(rng: np.random.Generator) -> tuple[list[Any], list[Any]]:
    """The network up to the pooled features `flat` [N, 64], and its initializers."""
    from onnx import numpy_helper, helper

    inits: list[Any] = []
    nodes: list[Any] = []
    prev, x = 3, INPUT
    for i, ch in enumerate(CHANNELS):
        fan_in = prev * 3 * 3
        w = (rng.standard_normal((ch, prev, 3, 3)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = (rng.standard_normal(ch) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"conv{i}_w"), numpy_helper.from_array(b, f"conv{i}_b")]
        nodes.append(helper.make_node("Conv", [x, f"conv{i}_w", f"conv{i}_b"], [f"conv{i}"],
                                      kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"]))
        prev, x = ch, f"relu{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"]))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1))
    return nodes, inits


def _model(nodes: list[Any], inits: list[Any], output: str, width: int) -> Any:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", width])],
        initializer=inits,
    )
    # opset 17 and IR 8: what every onnxruntime of the last years reads.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tiny_cnn")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def model_proto() -> Any:
    """The model as an `onnx.ModelProto` (checked by `onnx.checker`).

    An untrained net's pooled features are much alike from image to image
    (all positive, each channel near its own mean), so a random classifier
    on them gives every image the same class. The last layer therefore
    standardizes the features by their mean and spread over 32 calibration
    images (`synthetic_photo`, seeds 10000..; run through the feature part
    with onnxruntime) before its random projection, folded into the Gemm's
    weights and bias: the top-1 class then varies between images (about 70
    classes over 100 images) and the top-1 score spreads over (0, 1).
    """
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(SEED)
    nodes, inits = _features_proto(rng)
    feats = ort.InferenceSession(_model(nodes, inits, "flat", CHANNELS[-1]).SerializeToString(),
                                 providers=["CPUExecutionProvider"])
    cal = np.stack([decode(synthetic_photo(10000 + i, 320, 240)) for i in range(32)])
    f = feats.run(["flat"], {INPUT: cal})[0].astype(np.float64)
    mu, sd = f.mean(axis=0), f.std(axis=0) + 1e-6
    proj = rng.standard_normal((CLASSES, CHANNELS[-1])) / 4.0
    w = (proj / sd[None, :]).astype(np.float32)     # logits = proj @ ((f - mu) / sd)
    b = (-(w.astype(np.float64) @ mu)).astype(np.float32)
    inits = inits + [numpy_helper.from_array(w, "fc_w"), numpy_helper.from_array(b, "fc_b")]
    nodes = nodes + [
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], [OUTPUT], axis=1),
    ]
    return _model(nodes, inits, OUTPUT, CLASSES)


def build(path: str | os.PathLike[str]) -> str:
    """Writes the model to `path` (atomically: a temp file, then a rename) and returns the path."""
    import onnx

    out = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    onnx.save(model_proto(), tmp)
    os.replace(tmp, out)
    return out


def load(path: str | os.PathLike[str]) -> Any:
    """An `onnxruntime.InferenceSession` of the model at `path`, CPU only, with
    one intra-op thread.

    One thread because a data engine runs one copy of the model per worker (a
    process, or a concurrent call) and gets its parallelism from the workers:
    workers x threads should not exceed the cores, or the threads of the
    copies preempt each other (and onnxruntime's spinning threads burn CPU
    the decoders need). Inter-op parallelism is off for the same reason.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(os.fspath(path), sess_options=opts, providers=["CPUExecutionProvider"])


def preprocess(image: Any) -> np.ndarray:
    """A PIL image as the model's input row: RGB, resized to 224x224
    (bilinear), float32 CHW in [0, 1], normalized by ImageNet's mean and std."""
    from PIL import Image

    im = image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    x = np.asarray(im, dtype=np.float32).transpose(2, 0, 1) * np.float32(1 / 255)
    out: np.ndarray = (x - MEAN) / STD
    return out


def decode(data: bytes) -> np.ndarray:
    """`preprocess` of an encoded image's bytes (JPEG, PNG, ...)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return preprocess(im)


def top1(session: Any, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(classes, scores) of a batch (N, 3, 224, 224) in one call of the model."""
    probs = session.run([OUTPUT], {INPUT: np.ascontiguousarray(batch, dtype=np.float32)})[0]
    cls = probs.argmax(axis=1)
    return cls, probs[np.arange(len(cls)), cls]


# ---------------------------------------------------------------------------
# Photo-like test images (no data set to download)

_FIELDS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _fields(width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """A texture (noise at 1/4 scale, upsampled: foliage, fabric) and a fine
    noise (sensor grain) field, 64 px larger than the image, made once per
    process; each image takes crops of them at its own offsets."""
    f = _FIELDS.get((width, height))
    if f is None:
        from PIL import Image

        rng = np.random.default_rng(12345)
        h, w = height + 64, width + 64
        small = rng.standard_normal((h // 4, w // 4, 3)).astype(np.float32)
        noise = Image.fromarray((small * 40 + 128).clip(0, 255).astype(np.uint8))
        tex = np.asarray(noise.resize((w, h), Image.Resampling.BICUBIC), np.float32) - 128
        fine = rng.standard_normal((h, w, 3)).astype(np.float32)
        f = _FIELDS[(width, height)] = (tex, fine)
    return f


def synthetic_photo(i: int, width: int = 640, height: int = 480, quality: int = 85) -> bytes:
    """JPEG bytes of image `i` (the same bytes for the same arguments):
    per-channel gradients and low-frequency waves, a texture and sensor
    noise. At 640x480 and quality 85 about 100 KB, as a photo of that size;
    a flat gradient would compress to a tenth of that and decode faster than
    any real image."""
    import io

    from PIL import Image

    rng = np.random.default_rng(i)
    tex, fine = _fields(width, height)
    x = (np.arange(width, dtype=np.float32) / width)[None, :]
    y = (np.arange(height, dtype=np.float32) / height)[:, None]
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b = rng.uniform(-120, 120, 2)
        base = (128 + a * (x - 0.5)) + b * (y - 0.5)
        for _ in range(4):  # sin(u + v) from 1-D arrays: outer products, not 2-D trigonometry
            fx, fy, ph, amp = rng.uniform(1, 12), rng.uniform(1, 12), rng.uniform(0, 6.3), rng.uniform(10, 40)
            u, v = 2 * np.pi * fx * x + ph, 2 * np.pi * fy * y
            base = base + amp * (np.sin(u) * np.cos(v) + np.cos(u) * np.sin(v))
        img[..., c] = base
    ox, oy, px, py = rng.integers(0, 64, 4)
    img += tex[oy:oy + height, ox:ox + width]
    img += fine[py:py + height, px:px + width] * 6.0
    out = io.BytesIO()
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    return out.getvalue()


def _write_range(args: tuple[str | os.PathLike[str], int, int, int, int]) -> int:
    d, start, stop, width, height = args
    total = 0
    for i in range(start, stop):
        data = synthetic_photo(i, width, height)
        with open(os.path.join(d, f"img{i:05}.jpg"), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def write_jpegs(d: str | os.PathLike[str], n: int, width: int = 640, height: int = 480, processes: int = 1) -> int:
    """Writes `synthetic_photo(i)` for i < n as `d/img00000.jpg`.. (in
    `processes` spawned processes when > 1); returns the bytes written."""
    d = os.fspath(d)
    os.makedirs(d, exist_ok=True)
    if processes <= 1 or n < 64:
        return _write_range((d, 0, n, width, height))
    import multiprocessing

    step = -(-n // processes)
    parts = [(d, s, min(n, s + step), width, height) for s in range(0, n, step)]
    with multiprocessing.get_context("spawn").Pool(len(parts)) as pool:
        return sum(pool.map(_write_range, parts))


if __name__ == "__main__":
    import time

    out = build(sys.argv[1] if len(sys.argv) > 1 else "tiny_cnn.onnx")
    s = load(out)
    x = np.random.default_rng(0).random((32, 3, SIZE, SIZE), dtype=np.float32)
    top1(s, x)
    t0 = time.perf_counter()
    cls, score = top1(s, x)
    dt = time.perf_counter() - t0
    print(f"wrote {out} ({os.path.getsize(out)} bytes); {dt / 32 * 1e3:.2f} ms per image "
          f"in batches of 32; classes {cls[:8].tolist()}...")
