"""Notebook display: `Chain._repr_html_`, an HTML table of a chain's first
rows (as Daft's DataFrame shows in Jupyter), with image files as inline
thumbnails.

Guarantees: the chain runs once, limited to ROWS + 1 rows (the extra row
says whether there are more); thumbnails are made natively
(`_internal.image_thumbnail_jpeg`) inside that same run by a map UDF over
each File column, reading through the engine's source (prefetch, caches),
and embedded as `data:` URIs, so the HTML needs no server; a file that is
not a readable image shows its path and size only. The row count is shown
when the run saw every row (at most ROWS); otherwise the table says there
are more (`count()` counts them). Every text is HTML-escaped and values
longer than CUT characters are cut (the whole value in the cell's title).
`Chain.show()` stays plain text.
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING, Any

from ._file import File, is_file_type
from ._pyarrow import pa

if TYPE_CHECKING:
    import pyarrow

    from ._chain import Chain

ROWS = 20
CUT = 120
THUMB_SIDE = 128
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff")
_PREFIX = "__udfchain_thumb_"


def _thumb(file: File | None) -> str:
    """A data: URI of the file's thumbnail, or "" when it is not an image."""
    try:
        if file is None or not file.path.lower().endswith(IMAGE_EXTENSIONS) or file.location:
            return ""
        from . import _internal

        jpeg = _internal.image_thumbnail_jpeg(file.read(), THUMB_SIDE)
        return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
    except Exception:
        return ""


def _text(value: object) -> str:
    text = "null" if value is None else str(value)
    if len(text) <= CUT:
        return html.escape(text)
    return f'<span title="{html.escape(text)}">{html.escape(text[:CUT])}…</span>'


def _file_cell(value: dict[str, Any], thumb: str) -> str:
    path = html.escape(str(value.get("path", "")))
    size = value.get("size")
    img = f'<img src="{thumb}" alt="{path}" style="max-width:{THUMB_SIDE}px;max-height:{THUMB_SIDE}px"><br>' if thumb else ""
    return f"{img}<small>{path} ({size} B)</small>"


def chain_html(chain: Chain, rows: int = ROWS) -> str:
    head = chain.limit(rows + 1)
    table = head.to_pyarrow()
    file_cols = [f.name for f in table.schema if is_file_type(f.type)]
    if file_cols:
        with_thumbs = head
        for i, name in enumerate(file_cols):
            with_thumbs = with_thumbs._udf("map", {f"{_PREFIX}{i}": _thumb}, [name], str, None)
        table = with_thumbs.to_pyarrow()
    return table_html(table, rows)


def table_html(table: pyarrow.Table, rows: int = ROWS) -> str:
    more = table.num_rows > rows
    table = table.slice(0, rows)
    names = [n for n in table.column_names if not n.startswith(_PREFIX)]
    file_cols = [f.name for f in table.schema if is_file_type(f.type)]
    thumbs = {
        name: table.column(f"{_PREFIX}{i}").to_pylist()
        for i, name in enumerate(file_cols)
        if f"{_PREFIX}{i}" in table.column_names
    }
    columns = {n: table.column(n).to_pylist() for n in names}
    out = ['<table class="udfchain"><thead><tr>']
    out += [f"<th>{html.escape(n)}</th>" for n in names]
    out.append("</tr></thead><tbody>")
    for r in range(table.num_rows):
        out.append("<tr>")
        for n in names:
            v = columns[n][r]
            if n in file_cols and isinstance(v, dict):
                cell = _file_cell(v, (thumbs.get(n) or [""] * table.num_rows)[r] or "")
            else:
                cell = _text(v)
            out.append(f'<td style="text-align:left;vertical-align:top">{cell}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    if more:
        out.append(f"<p>first {rows} rows shown; <code>count()</code> counts them all</p>")
    else:
        out.append(f"<p>{table.num_rows} rows</p>")
    return "".join(out)
