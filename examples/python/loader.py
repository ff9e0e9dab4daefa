#!/usr/bin/env python3
"""Read a udfchain dataset from `udfchain serve` over Arrow Flight.

No bindings to build: only pyarrow (and, for the PyTorch adapter, torch).

    from loader import FlightLoader
    loader = FlightLoader("grpc://127.0.0.1:50051",
                          {"dataset": "images", "partition_rows": 1000,
                           "shuffle": True, "seed": 7}, prefetch=2)
    for epoch in range(3):
        for batch in loader.epoch(epoch):      # pyarrow.RecordBatch
            train_step(batch)

`FlightLoader.epoch(e)` asks the server for the epoch's plan (one Flight
endpoint per partition, in reading order) and reads the endpoints in order on a
background thread that keeps `prefetch` partitions ahead of the consumer (the
server also reads ahead of each client; see docs/training.md, "Arrow Flight").
`TorchIterableDataset` (only when torch is importable) gives each PyTorch
DataLoader worker its own share of the rows (`worker`/`num_workers` in the
request), so every row goes to exactly one worker.

As a script: `loader.py ADDRESS REQUEST_JSON [--prefetch K] [--epoch E]
[--column NAME]` reads one epoch and prints a JSON summary: rows, batches,
partitions, and for --column the values in read order and their sum
("checksum").
"""

import argparse
import json
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow.flight as flight

_DONE = object()

# The server sends pyarrow's client (Arrow's C++ one, which accepts messages
# of any size) messages of up to 16 MiB unless the request's
# "max_message_bytes" says otherwise: a few large messages read about twice as
# fast as many of 2 MiB, every other gRPC client's default.


class FlightLoader:
    """Iterates epochs of a `udfchain serve` flight, `prefetch` partitions ahead."""

    def __init__(self, location: str, request: dict[str, Any], prefetch: int = 2) -> None:
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        self.location = location
        self.request = dict(request)
        self.prefetch = prefetch
        self.partitions_read = 0

    def plan(self, epoch: int = 0, client: Any = None) -> Any:
        """The epoch's FlightInfo: one endpoint per partition, in reading order."""
        request = dict(self.request, epoch=epoch)
        if "prefetch_partitions" not in request:
            request["prefetch_partitions"] = self.prefetch
        client = client or flight.connect(self.location)
        descriptor = flight.FlightDescriptor.for_command(json.dumps(request))
        return client.get_flight_info(descriptor)

    def partitions(self, epoch: int = 0) -> Iterator[Any]:
        """Yields each partition of the epoch as a pyarrow.Table, in order."""
        client = flight.connect(self.location)
        info = self.plan(epoch, client)
        endpoints = list(info.endpoints)
        if self.prefetch == 0:
            for endpoint in endpoints:
                table = client.do_get(endpoint.ticket).read_all()
                self.partitions_read += 1
                yield table
            return
        ahead: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def fetch() -> None:
            try:
                for endpoint in endpoints:
                    if stop.is_set():
                        return
                    table = client.do_get(endpoint.ticket).read_all()
                    while not stop.is_set():
                        try:
                            ahead.put(table, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                ahead.put(_DONE)
            except BaseException as e:  # re-raised in the consumer
                ahead.put(e)

        thread = threading.Thread(target=fetch, daemon=True)
        thread.start()
        try:
            while True:
                item = ahead.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                self.partitions_read += 1
                yield item
        finally:
            stop.set()

    def epoch(self, epoch: int = 0) -> Iterator[Any]:
        """Yields the epoch's record batches, in order."""
        for table in self.partitions(epoch):
            yield from table.to_batches()


try:
    import torch.utils.data as _torch_data
except ImportError:  # torch is optional
    _torch_data = None

if _torch_data is not None:

    class TorchIterableDataset(_torch_data.IterableDataset):  # type: ignore[misc]  # torch is untyped here
        """A PyTorch IterableDataset of record batches (or of `transform(batch)`).

        Each DataLoader worker reads its own share: the request gets
        `worker`/`num_workers` from torch's worker info. Set `epoch` before
        each epoch (`dataset.epoch = e`) for a new shuffle order.
        """

        def __init__(
            self, location: str, request: dict[str, Any], prefetch: int = 2, transform: Callable[[Any], Any] | None = None
        ) -> None:
            super().__init__()
            self.location = location
            self.request = dict(request)
            self.prefetch = prefetch
            self.transform = transform
            self.epoch = 0

        def __iter__(self) -> Iterator[Any]:
            request = dict(self.request)
            info = _torch_data.get_worker_info()
            if info is not None:
                request["worker"] = info.id
                request["num_workers"] = info.num_workers
            loader = FlightLoader(self.location, request, self.prefetch)
            for batch in loader.epoch(self.epoch):
                yield self.transform(batch) if self.transform else batch


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("location", help="e.g. grpc://127.0.0.1:50051")
    p.add_argument("request", help='JSON, e.g. {"dataset": "items"}')
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--column", help="report this column's values and their sum")
    args = p.parse_args(argv)
    loader = FlightLoader(args.location, json.loads(args.request), args.prefetch)
    rows = batches = 0
    values: list[Any] = []
    for batch in loader.epoch(args.epoch):
        rows += batch.num_rows
        batches += 1
        if args.column:
            values.extend(batch.column(args.column).to_pylist())
    summary: dict[str, Any] = {"rows": rows, "batches": batches, "partitions": loader.partitions_read}
    if args.column:
        summary["values"] = values
        summary["checksum"] = sum(v for v in values if v is not None)
    json.dump(summary, sys.stdout)
    print()


if __name__ == "__main__":
    main()
