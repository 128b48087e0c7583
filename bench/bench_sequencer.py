"""Benchmark: Sequencer throughput (queue_uncommitted + step) on one core.

Workload: 16 producers publish transactions of 100 CONTINUE_TXN messages plus
one ACK_TXN each, interleaved message by message into one journal; the
Sequencer (ring 8192) serves every commit from its ring. Envelopes are built
before timing. Throughput counts every message read (CONTINUE and ACK).

Also measured in the same process: a baseline (a bare loop constructing the
same number of Envelopes, i.e. the cheapest possible per-message Python work
with one allocation) and memory per tracked producer (tracemalloc).

Usage::

    python -m bench.bench_sequencer [--repeat 7] [--txns 40]

Prints one JSON object to stdout. Not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
import tracemalloc

from bench import targets
from bench.spread import Recorder
from harvest_outbox.sequencer import (
    IMPLEMENTATION,
    Envelope,
    Flags,
    ProducerState,
    PySequencer,
    Sequencer,
    build_uuid,
    new_producer_id,
)

PRODUCERS = 16
TXN_SIZE = 100
RING = 8192
JOURNAL = "bench/0"
TARGET = 300_000


def build_workload(txns_per_producer: int) -> list[Envelope]:
    producers = [new_producer_id() for _ in range(PRODUCERS)]
    clocks = [1 << 60] * PRODUCERS
    envs: list[Envelope] = []
    offset = 0
    for _ in range(txns_per_producer):
        for i in range(TXN_SIZE + 1):
            flags = Flags.CONTINUE_TXN if i < TXN_SIZE else Flags.ACK_TXN
            for p in range(PRODUCERS):
                clocks[p] += 160
                envs.append(Envelope(JOURNAL, offset, offset + 1, build_uuid(producers[p], clocks[p], flags), i))
                offset += 1
    return envs


def run_sequencer(envs: list[Envelope], cls: type = Sequencer) -> tuple[float, int]:
    seq = cls(ring_size=RING)
    queue = seq.queue_uncommitted
    step = seq.step
    delivered = 0
    gc.disable()
    t0 = time.perf_counter()
    for env in envs:
        if queue(env) >= 7:  # a committing outcome (ACK_*; OUTSIDE_COMMIT absent here)
            while step() is not None:
                delivered += 1
    elapsed = time.perf_counter() - t0
    gc.enable()
    return elapsed, delivered


def run_baseline(envs: list[Envelope]) -> float:
    # The same number of iterations, each building one Envelope from fields.
    fields = [(e.journal, e.begin, e.end, e.uuid, e.message) for e in envs]
    make = Envelope
    gc.disable()
    t0 = time.perf_counter()
    for j, b, e, u, m in fields:
        make(j, b, e, u, m)
    elapsed = time.perf_counter() - t0
    gc.enable()
    return elapsed


def memory_per_producer(n: int = 20_000, cls: type = Sequencer) -> dict[str, float]:
    ids = {new_producer_id() for _ in range(n)}
    states = [ProducerState(JOURNAL, p, 1 << 60, 12345) for p in ids]
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    seq = cls(states=states, ring_size=1)
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(seq.checkpoint()[1]) == len(ids)
    return {"tracked_producers": len(ids), "bytes_per_producer": round((after - before) / len(ids), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="repeats, each timing all three loops")
    ap.add_argument("--txns", type=int, default=40, help="transactions per producer per run")
    args = ap.parse_args()

    envs = build_workload(args.txns)
    expect = len(envs)  # every message of every transaction commits
    recorder = Recorder(args.repeat, "one untimed pass over a quarter of the workload", targets.for_bench("sequencer"))
    seq_rates: list[float] = []
    base_rates: list[float] = []
    pure_rates: list[float] = []  # the pure-Python reference on the same workload (without the native build)
    run_sequencer(envs[: len(envs) // 4])  # warm-up

    def native() -> None:
        elapsed, delivered = run_sequencer(envs)
        assert delivered == expect, (delivered, expect)
        seq_rates.append(len(envs) / elapsed)

    def baseline() -> None:
        base_rates.append(len(envs) / run_baseline(envs))

    def pure() -> None:
        pure_rates.append(len(envs) / run_sequencer(envs, PySequencer)[0])

    for n in range(args.repeat):
        # one of each per repeat, the order reversed each repeat (bench/spread.py's alternate())
        for side in (native, baseline, pure) if n % 2 == 0 else (pure, baseline, native):
            side()
    recorder.figure("baseline", seq_rates, base_rates, "sequencer / envelope-construction loop, msg/s")
    recorder.figure("pure_python", seq_rates, pure_rates, "this build's sequencer / the pure-Python one, msg/s")
    seq_median = statistics.median(seq_rates)
    base_median = statistics.median(base_rates)
    print(
        json.dumps(
            {
                "benchmark": "sequencer.queue_uncommitted+step",
                "python": platform.python_version(),
                "implementation": platform.python_implementation(),
                "producers": PRODUCERS,
                "txn_size": TXN_SIZE,
                "ring_size": RING,
                "messages_per_run": len(envs),
                "repeat": args.repeat,
                "msgs_per_s_median": round(seq_median),
                "msgs_per_s_best": round(max(seq_rates)),
                "msgs_per_s_runs": [round(r) for r in seq_rates],
                "ns_per_msg_median": round(1e9 / seq_median, 1),
                "baseline_envelope_construct_per_s_median": round(base_median),
                "ratio_sequencer_to_baseline": round(seq_median / base_median, 3),
                "target_msgs_per_s": TARGET,
                "meets_target": seq_median >= TARGET,
                "memory": memory_per_producer(),
                "sequencer_implementation": IMPLEMENTATION,
                "pure_python_msgs_per_s_median": round(statistics.median(pure_rates)),
                "ratio_to_pure_python": round(seq_median / statistics.median(pure_rates), 2),
                "pure_python_memory": memory_per_producer(cls=PySequencer),
                # Other processes on the machine skew wall-clock rates; see the ratio.
                "loadavg_1min": round(os.getloadavg()[0], 2),
                "spread": recorder.report(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
