"""The UDF bodies every peer of the Python benchmark runs (benches/python.rs).

At module level, so worker processes (udfchain `processes=`, DataChain
`parallel=`, Daft `use_process=`) import them by name. A: hash every byte
with hashlib. C: a pure-Python CPU loop over the file's bytes,
`UDFCHAIN_BENCH_BURN_ROUNDS` times (the driver sets it so one call takes
about 20 ms on this machine).
"""

import hashlib
import os

ROUNDS = int(os.environ.get("UDFCHAIN_BENCH_BURN_ROUNDS", "1"))


def sha_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def burn_bytes(data: bytes) -> int:
    h = 0
    for _ in range(ROUNDS):
        for b in data:
            h = (h * 31 + b) & 0xFFFFFFFF
    return h


def sha_file(file) -> str:
    return sha_bytes(file.read())


def burn_file(file) -> int:
    return burn_bytes(file.read())


def ident(x: int) -> int:
    return x
