"""`udfchain ui` in a real browser: headless Chromium from the distribution
(`apt-get install chromium`; nothing is downloaded) driven by the `playwright`
package over a real `udfchain ui` process on 127.0.0.1, on a dataset of images
written by Pillow. It opens the datasets page, a version (50 rows, every
thumbnail loaded), pages forward, filters with a WHERE, opens a row, runs a
query and compares two versions, and checks that no request failed and the
console logged no error. Screenshots of the pages go to
$UDFCHAIN_UI_SCREENSHOTS (docs/ui to refresh the docs' images), else to a
temp dir.

Skipped, saying why, when Chromium, playwright or the udfchain binary (built
by `cargo build` / `cargo test` into $CARGO_TARGET_DIR) is missing."""

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from pathlib import Path

Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
N_IMAGES = 60
TOKEN = "browser-test-token-7"


def udfchain_bin() -> str | None:
    if os.environ.get("UDFCHAIN_BIN"):
        return os.environ["UDFCHAIN_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/udfchain-target"))
    path = os.path.join(target, "debug", "udfchain")
    return path if os.path.exists(path) else None


@pytest.fixture
def ui_server(tmp_path: Path, root: Path) -> Iterator[str]:
    if CHROMIUM is None:
        pytest.skip("no system Chromium: apt-get install -y chromium (.ci/run does)")
    exe = udfchain_bin()
    if exe is None:
        pytest.skip("no udfchain binary: run `cargo build` (CARGO_TARGET_DIR) or set UDFCHAIN_BIN")
    images = tmp_path / "images"
    images.mkdir()
    for i in range(N_IMAGES):
        img = Image.new("RGB", (96 + i, 64), ((i * 37) % 256, (i * 11) % 256, 180))
        for x in range(0, 96, 8):
            for y in range(0, 64):
                img.putpixel((x, y), (255, 255, 255))
        img.save(images / f"img{i:03}.{'png' if i % 2 else 'jpg'}")
    script = tmp_path / "make.sql"
    script.write_text(
        f"CREATE DATASET imgs AS SELECT file, file.path AS name, file.size AS size "
        f"FROM read_storage('{images}');\n"
        f"CREATE DATASET imgs AS SELECT file, file.path AS name, "
        f"CASE WHEN file.path LIKE 'img00%' THEN file.size + 1 ELSE file.size END AS size "
        f"FROM read_storage('{images}') WHERE file.path <> 'img059.png';\n"
    )
    subprocess.run([exe, "--root", str(root), "--quiet", "run", str(script)], check=True)
    proc = subprocess.Popen(
        [exe, "--root", str(root), "ui", "--bind", "127.0.0.1:0", "--token", TOKEN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("udfchain ui: open http://127.0.0.1:"), (line, proc.stderr.read())
        url = line.removeprefix("udfchain ui: open ")
        assert url.endswith(f"/?token={TOKEN}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def shots_dir(tmp_path: Path) -> str:
    d = os.environ.get("UDFCHAIN_UI_SCREENSHOTS") or str(tmp_path / "shots")
    os.makedirs(d, exist_ok=True)
    return d


def thumbs_loaded(page: Any) -> list[int]:
    page.wait_for_function(
        "() => [...document.querySelectorAll('img.thumb')].every(i => i.complete)", timeout=30000
    )
    widths: list[int] = page.eval_on_selector_all("img.thumb", "els => els.map(e => e.naturalWidth)")
    return widths


def test_ui_in_a_browser(ui_server: str, tmp_path: Path) -> None:
    shots = shots_dir(tmp_path)
    base = ui_server.split("/?token=")[0]
    failed, errors = [], []
    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("requestfailed", lambda r: failed.append(f"{r.url} {r.failure}"))
        page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))

        # The datasets page (the token arrives once, then a cookie carries it).
        page.goto(ui_server)
        assert page.locator("#datasets tr.dataset").count() == 1
        assert page.locator("#datasets tr.dataset td.num").first.inner_text() == str(N_IMAGES - 1)
        page.screenshot(path=os.path.join(shots, "datasets.png"))

        # Version 1: 50 rows, every thumbnail decoded.
        page.click("#datasets a.version >> text=v1")
        assert page.locator("#total").inner_text() == str(N_IMAGES)
        assert page.locator("#rows tr.row").count() == 50
        widths = thumbs_loaded(page)
        assert len(widths) == 50 and all(w > 0 for w in widths), widths
        page.screenshot(path=os.path.join(shots, "version.png"))

        # Next page: the last 10.
        page.click("a.next >> nth=0")
        assert page.locator("#rows tr.row").count() == N_IMAGES - 50
        assert all(w > 0 for w in thumbs_loaded(page))
        page.click("a.prev >> nth=0")
        assert page.locator("#rows tr.row").count() == 50
        assert all(w > 0 for w in thumbs_loaded(page))

        # A WHERE filter; its count arrives after the page.
        page.fill("#where", "name LIKE 'img01%'")
        page.click("#apply")
        assert page.locator("#rows tr.row").count() == 10
        page.wait_for_selector("#count[data-done='1']")
        assert page.locator("#count").inner_text() == "10"
        assert all(w > 0 for w in thumbs_loaded(page))
        page.screenshot(path=os.path.join(shots, "filtered.png"))

        # A row: the full image and the file's metadata.
        page.click("#rows a.rowlink >> nth=2")
        full = page.locator("#row img.full")
        assert full.count() == 1
        page.wait_for_function("() => document.querySelector('#row img.full').complete")
        assert page.eval_on_selector("#row img.full", "e => e.naturalWidth") > 0
        assert "img012.jpg" in page.locator("#row").inner_text()
        assert page.locator("a.next").count() == 1
        page.screenshot(path=os.path.join(shots, "row.png"), full_page=True)

        # The query box, and its link.
        page.click("nav >> text=Query")
        page.fill("#q", "SELECT name, size, file FROM read_dataset('imgs', '1') WHERE size > 0 ORDER BY name DESC LIMIT 7")
        page.click("#run")
        assert page.locator("#rows tr.row").count() == 7
        assert all(w > 0 for w in thumbs_loaded(page))
        page.wait_for_selector("#count[data-done='1']")
        assert page.locator("#count").inner_text() == "7"
        link = page.get_attribute("#permalink", "href")
        page.screenshot(path=os.path.join(shots, "query.png"))
        page.goto(base + link)
        assert page.locator("#rows tr.row").count() == 7
        # (its count is fetched after the page: let it finish before leaving)
        page.wait_for_selector("#count[data-done='1']")
        assert page.locator("#count").inner_text() == "7"

        # A refused statement shows why and runs nothing.
        page.goto(base + "/query")
        page.fill("#q", "CREATE TABLE t AS SELECT 1")
        failed_before, errors_before = len(failed), len(errors)
        page.click("#run")
        assert "only SELECT" in page.locator("#error").inner_text()
        assert page.locator("#rows tr.row").count() == 0
        # That page's own 400 (and Chrome's console line for it) is expected.
        assert [f.split()[0] for f in failed[failed_before:]] == ["400"], failed
        assert len(errors[errors_before:]) <= 1 and all("400" in e for e in errors[errors_before:])
        del failed[failed_before:], errors[errors_before:]

        # Compare v1 and v2 by name.
        page.goto(base + "/")
        page.click("a.compare")
        page.select_option("#key", "name")
        page.click("#compare")
        assert page.locator("#added").inner_text() == "0"
        assert page.locator("#removed").inner_text() == "1"
        assert page.locator("#changed").inner_text() == "10"
        assert all(w > 0 for w in thumbs_loaded(page))
        page.screenshot(path=os.path.join(shots, "compare.png"))
        browser.close()
    assert failed == [], failed
    assert errors == [], errors
