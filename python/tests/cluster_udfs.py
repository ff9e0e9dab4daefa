"""UDFs the cluster tests run on Python executors, imported there by module
and name (the executors have this directory on their PYTHONPATH). Each
writes what it saw where the test reads it: `UDFCHAIN_TEST_SETUP_LOG` (one
line per setup: the process id), `UDFCHAIN_TEST_CALL_LOG` (one line per
`slow` call)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import udfchain as uc


def pid_of(file: uc.File) -> int:
    return os.getpid()


def size_of(file: uc.File) -> int:
    return len(file.read())


def halves(file: uc.File) -> Iterator[str]:
    data = file.read()
    yield f"{file.path}:{len(data) // 2}"
    yield f"{file.path}:{len(data) - len(data) // 2}"


def firsts(file: list[uc.File]) -> list[int]:
    return [f.read()[0] for f in file]


def total(size: list[int]) -> list[int]:
    return [sum(size)]


def slow(file: uc.File) -> int:
    """0.3 s per call, each call logged (the Ctrl-C and kill tests count them)."""
    time.sleep(0.3)
    with open(os.environ["UDFCHAIN_TEST_CALL_LOG"], "a") as f:
        f.write(f"{os.getpid()} {file.path}\n")
    return file.size


def spin(file: uc.File) -> int:
    """Pure-Python CPU work (the cluster benchmark's C workload in small)."""
    h = 0
    for _ in range(30):
        for b in file.read():
            h = (h * 31 + b) % 1_000_003
    return h


class Tagger(uc.Mapper):
    """A class UDF with state: `setup` logs its process and builds the prefix."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def setup(self) -> None:
        with open(os.environ["UDFCHAIN_TEST_SETUP_LOG"], "a") as f:
            f.write(f"{os.getpid()}\n")
        self.prefix = self.tag + ":"

    def process(self, file: uc.File) -> str:
        return self.prefix + file.path
