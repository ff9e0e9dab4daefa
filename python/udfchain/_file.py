"""`File`: the value a Python UDF receives for a stored object.

Guarantees: `read()`, `read_text()`, `open()` and `get_local_path()` go
through the engine's source for the running call (a prefetched copy, the
shared cache or the store) and release the GIL while they wait. `open()` is a
seekable binary file: the local copy when there is one, else ranged reads of
the store (a header costs about a header's bytes); it streams, so reading a
file of any size through it in chunks holds one chunk at a time. `read()` and
`read_text()` return the whole object, so they hold all of it in memory. `get_local_path()` of a
local directory's file is the file itself; of a remote file, a copy valid
during the call only (without `cache=True` deleted after the row). Outside a UDF call (a File from `collect()`), reads raise.
"""

from __future__ import annotations

import datetime
import functools
import io
import os
from typing import IO, TYPE_CHECKING, Any, Protocol

from ._pyarrow import pa

if TYPE_CHECKING:
    import pyarrow

    from ._internal import FileFields

FILE_FIELDS = ("source", "path", "size", "version", "etag", "last_modified", "location")

class Access(Protocol):
    """What a File reads through: the engine's `FileAccess` of a UDF call,
    or a worker process's proxy of it."""

    def read(self, f: FileFields) -> bytes: ...
    def read_range(self, f: FileFields, start: int, end: int) -> bytes: ...
    def local_path(self, f: FileFields) -> str | None: ...
    def in_memory(self, f: FileFields) -> bool: ...


@functools.cache
def file_type() -> pyarrow.DataType:
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


def is_file_type(t: pyarrow.DataType) -> bool:
    return bool(pa.types.is_struct(t)) and tuple(t.field(i).name for i in range(t.num_fields)) == FILE_FIELDS


class File:
    """A stored object as a UDF receives it: `source` (the listed URL),
    `path` (relative to it), `size` (bytes), `version` and `etag` (as the
    store reports them, or None), `last_modified` (milliseconds since the
    epoch, UTC, or None), `location`; `url`, `name` and `modified` are
    derived. Inside a UDF call its bytes are read with `read()`,
    `read_text()`, `read_range()`, `open()` or `get_local_path()`."""

    __slots__ = FILE_FIELDS + ("_access",)

    source: str
    path: str
    size: int
    version: str | None
    etag: str | None
    last_modified: int | None
    location: str | None

    def __init__(
        self,
        source: str = "",
        path: str = "",
        size: int = 0,
        version: str | None = None,
        etag: str | None = None,
        last_modified: int | None = None,
        location: str | None = None,
        _access: Access | None = None,
    ) -> None:
        self.source = source
        self.path = path
        self.size = size
        self.version = version
        self.etag = etag
        self.last_modified = last_modified  # milliseconds since the epoch, UTC
        self.location = location
        self._access = _access

    def _fields(self) -> FileFields:
        return (self.source, self.path, self.size, self.version, self.etag, self.last_modified, self.location)

    def _reader(self) -> Access:
        if self._access is None:
            raise RuntimeError(f"{self.url}: File reads work inside a UDF call (this File has no call)")
        return self._access

    @property
    def name(self) -> str:
        """The last part of `path`."""
        return self.path.rsplit("/", 1)[-1]

    @property
    def url(self) -> str:
        """`source` and `path` joined: the object's full URL."""
        return f"{self.source.rstrip('/')}/{self.path}" if self.source else self.path

    @property
    def modified(self) -> datetime.datetime | None:
        """`last_modified` as a UTC datetime (None when unknown)."""
        if self.last_modified is None:
            return None
        return datetime.datetime.fromtimestamp(self.last_modified / 1000, tz=datetime.timezone.utc)

    def read(self) -> bytes:
        """The whole object's bytes, held in memory at once: read a large
        file through `open()` instead."""
        return self._reader().read(self._fields())

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes `start` to `end` (exclusive)."""
        return self._reader().read_range(self._fields(), start, end)

    def read_text(self, encoding: str = "utf-8") -> str:
        """The whole object decoded as text."""
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

    def read_image(self) -> Any:
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

    def open(self, mode: str = "rb") -> IO[bytes]:
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

    def __reduce__(self) -> tuple[type[File], FileFields]:
        # Its fields only: a File crosses to a worker process (or back) without
        # the call it reads through; the worker attaches its own.
        return (File, self._fields())

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (as a File column's struct holds them)."""
        return dict(zip(FILE_FIELDS, self._fields()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, File) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"File({self.url!r}, size={self.size})"


class _RangeReader(io.RawIOBase):
    """Reads a File by ranges from the store (no local copy)."""

    def __init__(self, file: File) -> None:
        self._file = file
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._file.size}[whence]
        if base + offset < 0:
            raise ValueError("seek before the start")
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        end = min(self._pos + len(b), self._file.size)
        if end <= self._pos:
            return 0
        data = self._file.read_range(self._pos, end)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def files_of(column: Any, access: Access | None) -> list[File | None]:
    """Files (or None) of a File struct column, reading through `access`."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    fields = [column.field(i) for i in range(len(FILE_FIELDS))]
    fields[5] = fields[5].cast(pa.int64())
    lists = [f.to_pylist() for f in fields]
    valid = column.is_valid().to_pylist()
    return [
        File(source, path, size, version, etag, modified, location, access) if ok else None
        for ok, source, path, size, version, etag, modified, location in zip(valid, *lists)
    ]
