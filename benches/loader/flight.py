#!/usr/bin/env python3
"""The pyarrow side of the loader benchmark's Flight half (benches/loader/flight.rs).

Two modes, each printing one JSON line per round on stdout:

    flight.py reference DIR --rounds N
        pyarrow's own Flight server, in this process on 127.0.0.1, serving the
        Arrow IPC stream files DIR/part-*.arrows (one partition each, the
        batches `udfchain serve` holds) from memory, one endpoint per
        partition; pyarrow's client reads every endpoint in order.
    flight.py client grpc://127.0.0.1:PORT REQUEST_JSON PARTITIONS --rounds N
        pyarrow's client reading `udfchain serve`: per round, get_flight_info
        with the request, wait (the "stats" action) until the server holds
        every partition, then read every endpoint in order.

Both time the same client loop (`read_partitions`), with pyarrow's default
client options, from the first do_get to the last batch: {"round": i,
"seconds": s, "rows": n}. A failure prints {"error": "..."} and exits 1.
"""

import argparse
import glob
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight


def read_partitions(client, endpoints):
    """Reads every endpoint in order; returns (rows, seconds)."""
    t0 = time.perf_counter()
    rows = 0
    for endpoint in endpoints:
        rows += client.do_get(endpoint.ticket).read_all().num_rows
    return rows, time.perf_counter() - t0


class Reference(flight.FlightServerBase):
    """Serves in-memory partitions: ticket b"i" is partition i."""

    def __init__(self, partitions):
        super().__init__("grpc://127.0.0.1:0")
        self.partitions = partitions

    def get_flight_info(self, context, descriptor):
        endpoints = [
            flight.FlightEndpoint(str(i).encode(), []) for i in range(len(self.partitions))
        ]
        rows = sum(t.num_rows for t in self.partitions)
        return flight.FlightInfo(self.partitions[0].schema, descriptor, endpoints, rows, -1)

    def do_get(self, context, ticket):
        return flight.RecordBatchStream(self.partitions[int(ticket.ticket)])


def load_partitions(directory):
    paths = sorted(glob.glob(os.path.join(directory, "part-*.arrows")))
    if not paths:
        raise RuntimeError(f"no part-*.arrows in {directory}")
    partitions = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()  # in memory, as the udfchain server holds them
        partitions.append(pa.ipc.open_stream(pa.py_buffer(data)).read_all())
    return partitions


def reference(args):
    server = Reference(load_partitions(args.dir))
    try:
        client = flight.connect(f"grpc://127.0.0.1:{server.port}")
        info = client.get_flight_info(flight.FlightDescriptor.for_command(b"all"))
        for i in range(args.rounds):
            rows, seconds = read_partitions(client, info.endpoints)
            print(json.dumps({"round": i, "seconds": seconds, "rows": rows}), flush=True)
        client.close()
    finally:
        server.shutdown()


def stats(client):
    (result,) = list(client.do_action(flight.Action("stats", b"")))
    return json.loads(result.body.to_pybytes())


def udfchain_client(args):
    client = flight.connect(args.address)
    descriptor = flight.FlightDescriptor.for_command(args.request)
    for i in range(args.rounds):
        info = client.get_flight_info(descriptor)
        deadline = time.monotonic() + 300
        while stats(client)["buffered_partitions"] < args.partitions:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read-ahead stuck: {stats(client)}")
            time.sleep(0.005)
        rows, seconds = read_partitions(client, info.endpoints)
        print(json.dumps({"round": i, "seconds": seconds, "rows": rows}), flush=True)
    client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    ref = sub.add_parser("reference")
    ref.add_argument("dir")
    ref.add_argument("--rounds", type=int, default=3)
    cli = sub.add_parser("client")
    cli.add_argument("address")
    cli.add_argument("request")
    cli.add_argument("partitions", type=int)
    cli.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        reference(args) if args.mode == "reference" else udfchain_client(args)
    except Exception as e:  # reported to the benchmark as a record
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
