"""Functions that build expressions: aggregates for `Chain.group_by` and the
engine's native image functions (docs/images.md).

    import udfchain as uc
    from udfchain import functions as F        # also `uc.func`

    chain.group_by(partition_by="label", n=F.count(), total=F.sum("file.size"))
    chain.mutate(thumb=F.image_thumbnail("file", max_side=128))

A column argument is a column name (dots reach into struct fields) or an
expression (`uc.C(...)`, or one of these functions); other arguments are
constants (a str is a constant there: a mode, a filter, a format) or
expressions. Every function only builds an expression: nothing runs until
the chain does.
"""

from __future__ import annotations

from typing import TypeAlias

from . import _internal
from ._internal import Expr

__all__ = [
    "avg",
    "count",
    "image_center_crop",
    "image_convert",
    "image_crop",
    "image_decode",
    "image_encode",
    "image_resize",
    "image_resize_to_fit",
    "image_size",
    "image_thumbnail",
    "image_to_tensor",
    "max",
    "min",
    "sum",
]

Value: TypeAlias = "Expr | str | int | float | bool | bytes | None"
"""What an argument may be: an expression or a constant."""


def _expr(e: Value) -> Expr:
    """An expression from an Expr, a column name (str) or a literal."""
    if isinstance(e, Expr):
        return e
    if isinstance(e, str):
        return _internal.col(e)
    return _internal.literal(e)


def _call(name: str, first: Expr | str, *args: Value) -> Expr:
    """`name(first, *args)`: `first` a column name or an expression, `args`
    constants (a str is a constant here) or expressions."""
    return _internal.function(name, [_expr(first), *args])


def _given(*optional: Value) -> list[Value]:
    return [o for o in optional if o is not None]


# Aggregates (for `Chain.group_by`).


def count(col: Expr | str | None = None) -> Expr:
    """The number of rows of the group (`count()`), or of its non-null
    values of `col`."""
    return _internal.aggregate("count", None if col is None else _expr(col))


def sum(col: Expr | str) -> Expr:  # noqa: A001 - DataChain's name
    """The sum of `col` over the group."""
    return _internal.aggregate("sum", _expr(col))


def avg(col: Expr | str) -> Expr:
    """The mean of `col` over the group."""
    return _internal.aggregate("avg", _expr(col))


def min(col: Expr | str) -> Expr:  # noqa: A001 - DataChain's name
    """The smallest value of `col` in the group."""
    return _internal.aggregate("min", _expr(col))


def max(col: Expr | str) -> Expr:  # noqa: A001 - DataChain's name
    """The largest value of `col` in the group."""
    return _internal.aggregate("max", _expr(col))


# Images (docs/images.md): `img` and `file` are a column name or an expression.


def image_decode(file: Expr | str = "file", mode: str | None = None, max_side: Value = None) -> Expr:
    """The image in a File column, or in a binary column of encoded images
    (an Image struct: width, height, mode, data; a null binary value gives
    null). `mode` ('L', 'RGB', 'RGBA'; default: the image's own) converts
    it; `max_side` is a size hint: a JPEG may decode at 1/2, 1/4 or 1/8 of
    its size in the DCT, its longer side still at least `max_side`."""
    if max_side is None:
        return _call("image_decode", file, *_given(mode))
    return _call("image_decode", file, _internal.literal(mode), max_side)


def image_thumbnail(file: Expr | str = "file", max_side: Value = 256) -> Expr:
    """RGB, its longer side at most `max_side`; a JPEG is decoded at reduced size in the DCT."""
    return _call("image_thumbnail", file, max_side)


def image_size(file: Expr | str = "file") -> Expr:
    """Width and height read from the header alone."""
    return _call("image_size", file)


def image_resize(img: Expr | str, width: Value, height: Value, filter: str | None = None) -> Expr:
    """Resized to width x height: filter "nearest", "bilinear", "bicubic" or "lanczos3"."""
    return _call("image_resize", img, width, height, *_given(filter))


def image_resize_to_fit(img: Expr | str, max_side: Value, filter: str | None = None) -> Expr:
    """Scaled so its longer side is at most `max_side`, keeping the aspect ratio."""
    return _call("image_resize_to_fit", img, max_side, *_given(filter))


def image_crop(img: Expr | str, x: Value, y: Value, width: Value, height: Value) -> Expr:
    """The `width` x `height` region whose top left corner is (`x`, `y`)."""
    return _call("image_crop", img, x, y, width, height)


def image_center_crop(img: Expr | str, width: Value, height: Value) -> Expr:
    """The centered `width` x `height` region."""
    return _call("image_center_crop", img, width, height)


def image_convert(img: Expr | str, mode: str) -> Expr:
    """To "RGB", "L" or "RGBA", as Pillow's convert does."""
    return _call("image_convert", img, mode)


def image_to_tensor(img: Expr | str, width: Value, height: Value, mode: str = "RGB") -> Expr:
    """An Arrow fixed-shape tensor (height, width, channels) of uint8:
    converted to `mode` and resized when the image is another size."""
    return _call("image_to_tensor", img, width, height, mode)


def image_encode(img: Expr | str, format: str, quality: Value = None) -> Expr:
    """Encoded as "jpeg", "png" or "webp" (binary); `quality` for JPEG."""
    return _call("image_encode", img, format, *_given(quality))
