"""`pa`: pyarrow, imported on first use.

`import pyarrow` also imports numpy and costs a few hundred ms of CPU. A
worker process (`processes=`) starts a fresh interpreter that imports
udfchain and the UDF's module; with plain values crossing its pipe it never
needs pyarrow, so it starts without it. Every module of the package reads
pyarrow as `pa` from here; an attribute is looked up in pyarrow once and then
kept, so later uses cost a plain attribute read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class _PyArrow:
    def __getattr__(self, name: str) -> Any:
        value = getattr(importlib.import_module("pyarrow"), name)
        self.__dict__[name] = value
        return value


__all__ = ["pa"]

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = _PyArrow()
