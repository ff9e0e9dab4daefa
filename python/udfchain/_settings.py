"""The keyword arguments of `Chain.settings` (and of the `read_*` sources):
one typed dict, so type checkers and IDEs know every name and its type.

Guarantees: each name is the engine's setting of that name (docs/settings.md),
checked as `SET` checks it (an unknown name raises `SettingError` suggesting
the closest one); `None` leaves a setting as it is; `processes` is Python's
own (worker processes, see `Chain.settings`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, TypedDict


class Settings(TypedDict, total=False):
    """`settings(**kw)`'s names and types; every one optional.

    Defaults (docs/settings.md): prefetch "auto", cache False, cache_limit
    none, parallel the number of cores (or `processes`), workers 1,
    batch_size 1000, ordered True, max_connections 128, on_error "fail",
    root $UDFCHAIN_ROOT or ./.udfchain, memory_limit none, memory_file_limit
    "1m", temp_dir_limit half the space free under the root's tmp at a run's start, progress False, cluster local, cluster_executor_timeout "60s",
    checkpoints True, delta_unsafe False, max_image_pixels 178956970,
    storage from the environment, processes None (in-process).
    """

    prefetch: int | Literal["auto"] | None
    cache: bool | None
    cache_limit: int | str | None
    parallel: int | None
    workers: int | None
    batch_size: int | None
    ordered: bool | None
    max_connections: int | None
    on_error: Literal["fail", "skip", "null"] | None
    root: str | os.PathLike[str] | None
    memory_limit: int | str | None
    memory_file_limit: int | str | None
    temp_dir_limit: int | str | None
    progress: bool | None
    cluster: str | None
    cluster_executor_timeout: str | None
    checkpoints: bool | Literal["fresh"] | None
    delta_unsafe: bool | None
    max_image_pixels: int | None
    storage: Mapping[str, str | int | bool] | None
    processes: int | bool | None
