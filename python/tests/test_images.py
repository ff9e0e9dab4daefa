"""Native image decoding against images written by Pillow: every format and
mode udfchain reads gives Pillow's pixels (exact for lossless formats, a
mean absolute difference of at most 1.5 for JPEG), resizing stays within a
small tolerance of Pillow's same filter, and the Arrow layout reads as a
numpy array (height, width, channels) without a copy."""

from pathlib import Path
from typing import Any

import pytest

import udfchain as uc

np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image")


def picture(w: int = 64, h: int = 48, seed: int = 0) -> Any:
    """A photo-like RGB array: gradients and texture."""
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 255 // w + seed) % 256, (y * 255 // h) % 256, (x * 7 + y * 13 + seed * 31) % 256], axis=-1)
    return rgb.astype(np.uint8)


def pixels(struct: dict[str, Any]) -> Any:
    """An image value (a dict from pyarrow) as an (H, W, C) array."""
    c = {"L": 1, "RGB": 3, "RGBA": 4}[struct["mode"]]
    return np.frombuffer(struct["data"], np.uint8).reshape(struct["height"], struct["width"], c)


def decoded(d: Path, expr: str = "image_convert(image_decode(file), 'RGB')") -> dict[str, Any]:
    t = uc.query(f"SELECT file.path AS path, {expr} AS img FROM read_storage('{d}')").to_pyarrow()
    return {p: img for p, img in zip(t.column("path").to_pylist(), t.column("img").to_pylist())}


CASES: list[tuple[str, str, dict[str, Any], bool]] = [
    # (file name, Pillow mode, save kwargs, lossless)
    ("rgb.png", "RGB", {}, True),
    ("rgba.png", "RGBA", {}, True),
    ("gray.png", "L", {}, True),
    ("palette.png", "P", {}, True),
    ("rgb.bmp", "RGB", {}, True),
    ("rgb.tiff", "RGB", {}, True),
    ("palette.gif", "P", {}, True),
    ("rgb.webp", "RGB", {"lossless": True}, True),
    ("rgb.jpg", "RGB", {"quality": 90}, False),
    ("gray.jpg", "L", {"quality": 90}, False),
]


def write_cases(d: Path) -> None:
    d.mkdir(exist_ok=True)
    base = Image.fromarray(picture())
    for name, mode, kw, _ in CASES:
        if mode == "RGBA":
            img = base.copy()
            img.putalpha(Image.fromarray(picture()[:, :, 2]))
        elif mode == "P":
            img = base.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
        else:
            img = base.convert(mode)
        img.save(d / name, **kw)


def test_every_format_and_mode_decodes_to_pillows_pixels(tmp_path: Path) -> None:
    d = tmp_path / "imgs"
    write_cases(d)
    got = decoded(d)
    assert set(got) == {name for name, *_ in CASES}
    for name, _, _, lossless in CASES:
        want = np.asarray(Image.open(d / name).convert("RGB"))
        have = pixels(got[name])
        assert have.shape == want.shape, name
        mad = np.abs(have.astype(int) - want.astype(int)).mean()
        if lossless:
            assert mad == 0, f"{name}: {mad}"
        else:
            assert mad <= 1.5, f"{name}: mean absolute difference {mad}"


def test_natural_modes_and_alpha_are_pillows(tmp_path: Path) -> None:
    d = tmp_path / "imgs"
    write_cases(d)
    got = decoded(d, "image_decode(file)")
    assert got["gray.png"]["mode"] == "L"
    assert got["rgba.png"]["mode"] == "RGBA"
    assert got["rgb.png"]["mode"] == "RGB"
    want = np.asarray(Image.open(d / "rgba.png").convert("RGBA"))
    assert (pixels(got["rgba.png"]) == want).all()
    want = np.asarray(Image.open(d / "rgb.png").convert("L"))
    gray = decoded(d, "image_convert(image_decode(file), 'L')")["rgb.png"]
    assert np.abs(pixels(gray)[:, :, 0].astype(int) - want.astype(int)).max() <= 1


@pytest.mark.parametrize(
    "name,pillow",
    [("nearest", Image.Resampling.NEAREST), ("bilinear", Image.Resampling.BILINEAR),
     ("bicubic", Image.Resampling.BICUBIC), ("lanczos3", Image.Resampling.LANCZOS)],
)
@pytest.mark.parametrize("size", [(100, 75), (224, 224), (640, 480)])
def test_resize_is_within_half_a_level_of_pillows_same_filter(tmp_path: Path, name: str, pillow: Any, size: tuple[int, int]) -> None:
    """The documented tolerance (docs/images.md): a mean absolute difference
    of at most 0.5 of 255 from Pillow's resize with the same filter."""
    d = tmp_path / "imgs"
    d.mkdir()
    Image.fromarray(picture(320, 240)).save(d / "a.png")
    got = decoded(d, f"image_resize(image_decode(file), {size[0]}, {size[1]}, '{name}')")["a.png"]
    want = np.asarray(Image.open(d / "a.png").resize(size, pillow))
    mad = np.abs(pixels(got).astype(int) - want.astype(int)).mean()
    assert mad <= 0.5, f"{name} {size}: mean absolute difference {mad} from Pillow"


def test_a_hostile_image_is_a_row_error_under_on_error(tmp_path: Path) -> None:
    d = tmp_path / "imgs"
    d.mkdir()
    Image.fromarray(picture()).save(d / "good.png")
    (d / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 50)
    # A PNG header claiming 100,000 x 100,000 pixels: refused before decoding.
    import struct, zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0))
    bomb += chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    (d / "bomb.png").write_bytes(bomb)
    c = uc.read_storage(str(d)).settings(on_error="skip")
    t = uc.run(
        f"SET on_error = 'skip'; SELECT file.path AS path, image_decode(file) AS img FROM read_storage('{d}')"
    )[-1]
    assert not isinstance(t, str) and t.column("path").to_pylist() == ["good.png"]
    with pytest.raises(uc.UdfchainError, match="over the limit"):
        uc.run(
            f"SET on_error = 'fail'; SELECT image_decode(file) FROM read_storage('{d}') "
            "WHERE file.path = 'bomb.png'"
        )
    assert c.count() == 3


def shape(img: Any) -> str:
    """An image column arrives in a UDF as a numpy array (H, W, C)."""
    return f"{type(img).__name__}{img.shape}{img.dtype}"


def test_an_image_column_reaches_a_udf_as_a_numpy_array_and_files_read_as_pillow(tmp_path: Path) -> None:
    d = tmp_path / "imgs"
    d.mkdir()
    Image.fromarray(picture(64, 48)).save(d / "a.png")
    Image.fromarray(picture(64, 48)).convert("L").save(d / "b.png")
    c = uc.query(f"SELECT file.path AS path, image_decode(file) AS img FROM read_storage('{d}')")
    got = dict(zip(*[c.map(s=shape, params="img").collect(k) for k in ("path", "s")]))
    assert got == {"a.png": "ndarray(48, 64, 3)uint8", "b.png": "ndarray(48, 64, 1)uint8"}

    def mean_via_pillow(file: uc.File) -> float:
        return float(np.asarray(file.read_image()).mean())

    means = uc.read_storage(str(d)).map(m=mean_via_pillow).collect("m")
    assert sorted(means) == sorted(
        [float(np.asarray(Image.open(d / n)).mean()) for n in ("a.png", "b.png")]
    )


def test_a_batch_of_same_size_images_is_one_array_without_a_copy(tmp_path: Path) -> None:
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(7):
        Image.fromarray(picture(40 + 8 * i, 30 + 4 * i, seed=i)).save(d / f"{i}.png")
    c = uc.query(
        f"SELECT file.path AS path, image_resize(image_convert(image_decode(file), 'RGB'), 32, 24) AS img "
        f"FROM read_storage('{d}') ORDER BY path"
    )
    seen = []

    def batch(imgs: Any) -> list[float]:
        array = np.asarray(imgs)
        # One view of the Arrow buffer: the first image's pixels are its first rows.
        seen.append((array.shape, np.shares_memory(array, imgs[0]), array.flags.writeable))
        assert all((array[i] == imgs[i]).all() for i in range(len(imgs)))
        return [float(m) for m in array.reshape(len(imgs), -1).mean(axis=1)]

    means = c.settings(batch_size=4).batch_map(m=batch, params="img").collect("m")
    whole = c.to_pyarrow().column("img").to_pylist()
    assert means == pytest.approx([float(pixels(v).mean()) for v in whole])
    assert sorted(s for s, _, _ in seen) == [(3, 24, 32, 3), (4, 24, 32, 3)]
    assert all(shared for _, shared, _ in seen), seen

    refused = []

    def unequal(imgs: Any) -> list[int]:
        if len({a.shape for a in imgs}) > 1:
            with pytest.raises(ValueError, match="different shapes"):
                np.asarray(imgs)
            refused.append(len(imgs))
        return [len(imgs)] * len(imgs)

    raw = uc.query(f"SELECT image_decode(file) AS img FROM read_storage('{d}')")
    raw.settings(batch_size=7).batch_map(n=unequal, params="img").collect("n")
    assert refused, "a batch of images of several shapes was refused"


def test_image_expressions_on_a_chain_equal_the_same_sql(tmp_path: Path) -> None:
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(5):
        Image.fromarray(picture(60 + 4 * i, 40, seed=i)).save(d / f"{i}.png")
    f = uc.func
    chain = (
        uc.read_storage(str(d))
        .mutate(img=f.image_resize(f.image_convert(f.image_decode("file"), "RGB"), 16, 12, "bicubic"))
        .mutate(thumb=f.image_thumbnail("file", 10), png=f.image_encode(f.image_center_crop("img", 8, 8), "png"))
        .order_by("file.path")
    )
    got = chain.to_pyarrow()
    want = uc.query(
        f"SELECT image_resize(image_convert(image_decode(file), 'RGB'), 16, 12, 'bicubic') AS img, "
        f"image_thumbnail(file, 10) AS thumb FROM read_storage('{d}') ORDER BY file.path"
    ).to_pyarrow()
    assert got.column("img").to_pylist() == want.column("img").to_pylist()
    assert got.column("thumb").to_pylist() == want.column("thumb").to_pylist()
    assert [(t["width"], t["height"]) for t in got.column("thumb").to_pylist()] == [(10, round(400 / (60 + 4 * i))) for i in range(5)]
    import io

    crops = [Image.open(io.BytesIO(b)) for b in got.column("png").to_pylist()]
    assert all(c.size == (8, 8) for c in crops)
    with pytest.raises(ValueError, match="no function image_blur"):
        uc._internal.function("image_blur", [uc.C("file")])


def test_sixteen_bit_gray_converts_as_pillow_clips_it(tmp_path: Path) -> None:
    d = tmp_path / "g16"
    d.mkdir()
    g = (np.arange(48 * 32).reshape(32, 48) * 53 % 65536).astype(np.uint16)
    g[0, :4] = [0, 1, 255, 256]
    for name in ("g16.png", "g16.tiff"):
        Image.fromarray(g).save(d / name)
        assert Image.open(d / name).mode.startswith("I;16"), name
    for mode in ("RGB", "L"):
        got = decoded(d, f"image_convert(image_decode(file), '{mode}')")
        for name in ("g16.png", "g16.tiff"):
            want = np.asarray(Image.open(d / name).convert(mode))
            px = pixels(got[name])
            assert (px.reshape(want.shape) == want).all(), (name, mode)
    natural = decoded(d, "image_decode(file)")
    assert {v["mode"] for v in natural.values()} == {"L"}


def test_image_to_tensor_is_an_arrow_fixed_shape_tensor_numpy_reads_whole(tmp_path: Path) -> None:
    import pyarrow as pa

    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(4):
        Image.fromarray(picture(30 + 10 * i, 20, seed=i)).save(d / f"{i}.png")
    t = uc.query(
        f"SELECT file.path AS path, image_to_tensor(image_decode(file), 16, 8) AS x, "
        f"image_to_tensor(image_decode(file), 4, 4, 'L') AS g FROM read_storage('{d}') ORDER BY path"
    ).to_pyarrow()
    x = t.column("x").combine_chunks()
    assert isinstance(x.type, pa.FixedShapeTensorType) and x.type.shape == [8, 16, 3]
    arr = x.to_numpy_ndarray()
    assert arr.shape == (4, 8, 16, 3) and arr.dtype == np.uint8
    for i, p in enumerate(t.column("path").to_pylist()):
        want = np.asarray(Image.open(d / p).convert("RGB").resize((16, 8), Image.BILINEAR))
        assert np.abs(arr[i].astype(int) - want).mean() < 1.0, p
    assert t.column("g").combine_chunks().to_numpy_ndarray().shape == (4, 4, 4, 1)
    expr = uc.read_storage(str(d)).select(x=uc.func.image_to_tensor(uc.func.image_decode("file"), 16, 8)).to_pyarrow()
    assert expr.column("x").combine_chunks().to_numpy_ndarray().shape == (4, 8, 16, 3)
    with pytest.raises(uc.UdfchainError, match="image_to_tensor"):
        uc.query(f"SELECT image_to_tensor(image_decode(file), file.size, 8) FROM read_storage('{d}')").to_pyarrow()


def test_decode_in_a_mode_and_the_pixel_limit(tmp_path: Path) -> None:
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(3):
        Image.fromarray(picture(40, 30, seed=i)).save(d / f"{i}.png")
    # image_decode(file, 'L') and the fused decode + resize give Pillow's gray pixels.
    got = decoded(d, "image_decode(file, 'L')")
    fused = decoded(d, "image_resize(image_decode(file, 'L'), 40, 30, 'bilinear')")
    for name, img in got.items():
        want = np.asarray(Image.open(d / Path(name).name).convert("L"))
        assert img["mode"] == "L"
        assert np.array_equal(pixels(img)[:, :, 0], want)
        assert fused[name] == img  # 40x30 to 40x30: the image as it is
    # 40x30 = 1200 pixels: over a limit of 1000 each image is its row's error.
    try:
        uc.run("SET max_image_pixels = 1000; SET on_error = 'null'")
        t = uc.query(f"SELECT image_decode(file) AS img FROM read_storage('{d}')").to_pyarrow()
        assert t.column("img").null_count == 3
        uc.run("SET on_error = 'fail'")
        with pytest.raises(uc.UdfchainError, match="over the limit of 1000"):
            uc.query(f"SELECT image_thumbnail(file, 8) AS t FROM read_storage('{d}')").to_pyarrow()
    finally:
        uc.run("SET max_image_pixels = 178956970; SET on_error = 'fail'")


def test_decode_bytes_and_a_max_side_hint(tmp_path: Path) -> None:
    import io

    def encoded(arr: Any, fmt: str, **kw: Any) -> bytes:
        out = io.BytesIO()
        Image.fromarray(arr).save(out, fmt, **kw)
        return out.getvalue()

    png = encoded(picture(40, 30, seed=1), "PNG")
    jpeg = encoded(picture(40, 30, seed=2), "JPEG", quality=90)
    f = uc.func
    t = (
        uc.read_values(k=[1, 2, 3], content=[png, jpeg, None])
        .mutate(img=f.image_decode("content"), small=f.image_resize(f.image_decode("content", "RGB"), 20, 15))
        .order_by("k")
        .to_pyarrow()
    )
    imgs = t.column("img").to_pylist()
    assert np.array_equal(pixels(imgs[0]), np.asarray(Image.open(io.BytesIO(png))))
    assert np.abs(pixels(imgs[1]).astype(int) - np.asarray(Image.open(io.BytesIO(jpeg))).astype(int)).mean() <= 1.5
    assert imgs[2] is None
    assert [s["width"] for s in t.column("small").to_pylist()[:2]] == [20, 20]
    # A JPEG of 800x600 with max_side=150 decodes at 1/4 in the DCT, as
    # Pillow's draft does for a 150x150 request: both are libjpeg-turbo's
    # scaled IDCT (measured: the same pixels).
    big = encoded(picture(800, 600, seed=3), "JPEG", quality=90)
    d = tmp_path / "big"
    d.mkdir()
    (d / "big.jpg").write_bytes(big)
    got = uc.read_storage(str(d)).select(img=f.image_decode("file", "RGB", max_side=150)).to_pyarrow()
    img = got.column("img").to_pylist()[0]
    drafted = Image.open(d / "big.jpg")
    drafted.draft("RGB", (150, 150))
    want = np.asarray(drafted.convert("RGB"))
    assert (img["height"], img["width"]) == want.shape[:2] == (150, 200)
    assert np.abs(pixels(img).astype(int) - want.astype(int)).mean() <= 1.5
    natural = uc.read_storage(str(d)).select(img=f.image_decode("file", max_side=150)).to_pyarrow()
    assert natural.column("img").to_pylist()[0] == img
