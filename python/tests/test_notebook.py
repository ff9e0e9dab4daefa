"""Notebook display: `Chain._repr_html_` is an HTML table of the first 20
rows with image files as inline JPEG thumbnails made natively; parsed here
as a browser would, the thumbnails decoded with Pillow."""

import base64
import io
from html.parser import HTMLParser

import pytest

import udfchain as uc
from pathlib import Path

Image = pytest.importorskip("PIL.Image")


class Table(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows = 0
        self.imgs: list[dict[str, str | None]] = []
        self.headers: list[str] = []
        self.text: list[str] = []
        self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr":
            self.rows += 1
        elif tag == "img":
            self.imgs.append(a)
        elif tag == "th":
            self._in_th = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "th":
            self._in_th = False

    def handle_data(self, data: str) -> None:
        if self._in_th:
            self.headers.append(data)
        self.text.append(data)


def parse(html: str) -> Table:
    t = Table()
    t.feed(html)
    t.rows -= 1  # the header row
    return t


def write_images(d: Path, n: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (300 + i, 200), (i * 9 % 256, 80, 160)).save(d / f"img{i:02}.jpg")


def test_repr_html_shows_twenty_rows_with_native_thumbnails(tmp_path: Path) -> None:
    d = tmp_path / "imgs"
    write_images(d, 25)
    (d / "notes.txt").write_text("not an image")
    good = (d / "img01.jpg").read_bytes()
    (d / "zz_truncated.jpg").write_bytes(good[: len(good) // 3])
    chain = uc.read_storage(str(d)).order_by("file.path")
    t = parse(chain._repr_html_())
    assert t.headers == ["file"]
    assert t.rows == 20
    assert "first 20 rows shown" in "".join(t.text)
    assert len(t.imgs) == 20
    for img in t.imgs:
        prefix = "data:image/jpeg;base64,"
        src = img["src"]
        assert src is not None and src.startswith(prefix)
        thumb = Image.open(io.BytesIO(base64.b64decode(src[len(prefix):])))
        assert thumb.format == "JPEG" and max(thumb.size) == 128, thumb.size


def test_repr_html_of_a_short_chain_counts_and_skips_non_images(tmp_path: Path) -> None:
    d = tmp_path / "few"
    write_images(d, 2)
    (d / "notes.txt").write_text("<b>not</b> an image")
    good = (d / "img01.jpg").read_bytes()
    (d / "zz_truncated.jpg").write_bytes(good[: len(good) // 3])
    chain = uc.read_storage(str(d)).mutate(size=uc.C("file.size"))
    html = chain._repr_html_()
    t = parse(html)
    assert t.headers == ["file", "size"]
    assert t.rows == 4
    assert "4 rows" in "".join(t.text)
    assert [i["alt"] for i in t.imgs] == ["img00.jpg", "img01.jpg"], "the truncated file and the text get no image"
    assert "zz_truncated.jpg" in "".join(t.text) and "notes.txt" in "".join(t.text)
    assert "<b>" not in html


def test_show_stays_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "s"
    write_images(d, 2)
    uc.read_storage(str(d)).show()
    out = capsys.readouterr().out
    assert "img00.jpg" in out and "<table" not in out and "data:image" not in out
