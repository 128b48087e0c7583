"""Avro encoding per row, in process (not a drain; no services): what each step of the relay's direct
Avro path costs on bench_registry's record (producer/encode/_avro_batch.py, producer/encode/_avro_compiled.py).

    .venv/bin/python -m bench.probe_avro_encode [--rows 20000] [--repeat 7]

Prints one JSON document, microseconds per row (the best of ``--repeat`` timed passes over
``--rows`` stored JSON values):

- ``loads``: the JSON parse (orjson with avro_batch's guard);
- ``fastavro_validate``, ``fastavro_write``: fastavro's strict validation and its ``schemaless_writer``
  (with the BytesIO and the wire-format prefix), the two steps the relay ran per row before the
  compiled pass;
- ``compiled``: the compiled check-and-write pass (wire-format prefix included);
- ``encode_values_fastavro``: the relay's per-batch loop as it was (parse, validate, write);
- ``encode_values``: the relay's per-batch loop now (parse, compiled pass; fastavro for what it leaves);
- ``poison_row``: one row in 100 with 1.5 in the ``long`` field, through ``encode_values`` (the
  refused rows take the compiled pass, then fastavro's validation for the reason).
"""

from __future__ import annotations

import argparse
import json
import os
import timeit
from collections.abc import Callable
from typing import Any

from bench.bench_registry import SCHEMA
from harvest_outbox.producer.encode._avro_batch import AvroWriter, encode_values, loads


def _rows(n: int, poison_every: int = 0) -> list[bytes]:
    def value(i: int) -> dict[str, Any]:
        bad = poison_every and i % poison_every == 0
        return {
            "id": i + 0.5 if bad else i,
            "customer": f"c-{i % 977:05d}",
            "amount": i * 0.25,
            "currency": "EUR",
            "note": "x" * 24,
        }

    return [json.dumps(value(i)).encode() for i in range(n)]


def _us_per_row(fn: Callable[[], Any], rows: int, repeat: int) -> float:
    return round(min(timeit.repeat(fn, number=1, repeat=repeat)) / rows * 1e6, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from fastavro import schemaless_writer
    from fastavro.validation import validate

    writer = AvroWriter(1, json.dumps(SCHEMA))
    raw = _rows(args.rows)
    poisoned = _rows(args.rows, poison_every=100)
    values = [loads(r) for r in raw]
    parsed = writer.parsed
    assert all(writer.encode(v) == writer.encode_by_fastavro(v) for v in values)  # the same bytes

    def fastavro_loop() -> list[Any]:
        out: list[Any] = []
        for r in raw:
            out.append(writer.encode_by_fastavro(loads(r)))
        return out

    def fastavro_write() -> None:
        import io

        for v in values:
            buf = io.BytesIO()
            buf.write(writer.prefix)
            schemaless_writer(buf, parsed, v)
            buf.getvalue()

    n, k = args.rows, args.repeat
    report = {
        "rows": n,
        "load_average": os.getloadavg(),
        "us_per_row": {
            "loads": _us_per_row(lambda: [loads(r) for r in raw], n, k),
            "fastavro_validate": _us_per_row(lambda: [validate(v, parsed, raise_errors=True) for v in values], n, k),
            "fastavro_write": _us_per_row(fastavro_write, n, k),
            "compiled": _us_per_row(lambda: [writer.encode(v) for v in values], n, k),
            "encode_values_fastavro": _us_per_row(fastavro_loop, n, k),
            "encode_values": _us_per_row(lambda: encode_values(writer, raw), n, k),
            "poison_row": _us_per_row(lambda: encode_values(writer, poisoned), n, k),
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
