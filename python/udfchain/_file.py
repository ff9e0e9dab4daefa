"""`File`: the value a Python UDF receives for a stored object.

Guarantees: `read()`, `read_text()`, `open()` and `get_local_path()` go
through the engine's source for the running call (a prefetched copy, the
shared cache or the store) and release the GIL while they wait. `open()` is a
seekable binary file: the local copy when there is one, else ranged reads of
the store (a header costs about a header's bytes). `get_local_path()` of a
local directory's file is the file itself; of a remote file, a copy valid
during the call only (without `cache=True` deleted after the row). Outside a UDF call (a File from `collect()`), reads raise.
"""

from __future__ import annotations

import datetime
import functools
import io
import os

from ._pyarrow import pa

FILE_FIELDS = ("source", "path", "size", "version", "etag", "last_modified", "location")

@functools.cache
def file_type() -> pa.DataType:
    """The Arrow type of a File column (the engine's `File::data_type`)."""
    return pa.struct(
        [
            pa.field("source", pa.string(), nullable=False),
            pa.field("path", pa.string(), nullable=False),
            pa.field("size", pa.uint64(), nullable=False),
            pa.field("version", pa.string()),
            pa.field("etag", pa.string()),
            pa.field("last_modified", pa.timestamp("ms", tz="UTC")),
            pa.field("location", pa.string()),
        ]
    )


def is_file_type(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) and tuple(t.field(i).name for i in range(t.num_fields)) == FILE_FIELDS


class File:
    """A stored object: `source` (the listed URL), `path` (relative to it), `size`, ..."""

    __slots__ = FILE_FIELDS + ("_access",)

    def __init__(self, source="", path="", size=0, version=None, etag=None, last_modified=None, location=None, _access=None):
        self.source = source
        self.path = path
        self.size = size
        self.version = version
        self.etag = etag
        self.last_modified = last_modified  # milliseconds since the epoch, UTC
        self.location = location
        self._access = _access

    def _fields(self):
        return (self.source, self.path, self.size, self.version, self.etag, self.last_modified, self.location)

    def _reader(self):
        if self._access is None:
            raise RuntimeError(f"{self.url}: File reads work inside a UDF call (this File has no call)")
        return self._access

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def url(self) -> str:
        return f"{self.source.rstrip('/')}/{self.path}" if self.source else self.path

    @property
    def modified(self) -> datetime.datetime | None:
        if self.last_modified is None:
            return None
        return datetime.datetime.fromtimestamp(self.last_modified / 1000, tz=datetime.timezone.utc)

    def read(self) -> bytes:
        """The whole object's bytes."""
        return self._reader().read(self._fields())

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes `start` to `end` (exclusive)."""
        return self._reader().read_range(self._fields(), start, end)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read().decode(encoding)

    def get_local_path(self) -> str:
        """A path on local disk: a local directory's file itself, else the
        prefetched (or cached) copy, valid for this call."""
        path = self._reader().local_path(self._fields())
        if path is None:
            raise RuntimeError(
                f"{self.url}: no local copy; get_local_path() needs prefetch > 0 or cache=True"
            )
        return path

    def read_image(self):
        """The image as a Pillow image (DataChain's `ImageFile.read()`);
        needs Pillow. Decoded from the prefetched copy when there is one."""
        try:
            from PIL import Image
        except ImportError:
            raise ImportError("File.read_image() needs Pillow: pip install pillow") from None
        with self.open() as f:
            img = Image.open(f)
            img.load()
        return img

    def open(self, mode: str = "rb"):
        """A seekable binary file-like object over the object's bytes."""
        if mode not in ("r", "rb"):
            raise ValueError(f"File.open is read-only and binary, not {mode!r}")
        access = self._reader()
        if access.in_memory(self._fields()):
            return io.BytesIO(self.read())
        path = access.local_path(self._fields())
        if path is not None:
            return open(path, "rb")
        return io.BufferedReader(_RangeReader(self), buffer_size=64 * 1024)

    def __reduce__(self):
        # Its fields only: a File crosses to a worker process (or back) without
        # the call it reads through; the worker attaches its own.
        return (File, self._fields())

    def as_dict(self) -> dict:
        return dict(zip(FILE_FIELDS, self._fields()))

    def __eq__(self, other):
        return isinstance(other, File) and self._fields() == other._fields()

    def __hash__(self):
        return hash(self._fields())

    def __repr__(self):
        return f"File({self.url!r}, size={self.size})"


class _RangeReader(io.RawIOBase):
    """Reads a File by ranges from the store (no local copy)."""

    def __init__(self, file: File):
        self._file = file
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=os.SEEK_SET):
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._file.size}[whence]
        if base + offset < 0:
            raise ValueError("seek before the start")
        self._pos = base + offset
        return self._pos

    def readinto(self, b):
        end = min(self._pos + len(b), self._file.size)
        if end <= self._pos:
            return 0
        data = self._file.read_range(self._pos, end)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def files_of(column: pa.Array, access) -> list:
    """Files (or None) of a File struct column, reading through `access`."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    fields = [column.field(i) for i in range(len(FILE_FIELDS))]
    fields[5] = fields[5].cast(pa.int64())
    lists = [f.to_pylist() for f in fields]
    valid = column.is_valid().to_pylist()
    return [
        File(*vals, _access=access) if ok else None
        for ok, *vals in zip(valid, *lists)
    ]
