"""split_sequencing's invariant: a range sequenced in chunks (open spans carried from chunk to chunk)
gives the rows (each with the same ack_offset and clock) and end states of one sequence_partition
over the whole range, from any starting
checkpoint, for any chunk size, ring size, policy and pruning horizon. Pure logic: no Spark, no Kafka."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from test_sequencing_columns import _random_log, _reference_sequence_partition, _table

from harvest_outbox.spark_reader.schema import SEQUENCED
from harvest_outbox.spark_reader.sequencing import GroupPlan, sequence_partition
from harvest_outbox.spark_reader.split_sequencing import SplitPlan, SplitSequencer

# tens of seconds of CPU: handed out early (tests/xdist_groups.py)
pytestmark = pytest.mark.long


@pytest.mark.parametrize("seed", range(10))
def test_chunked_equals_one_pass(seed) -> None:
    rng = random.Random(seed)
    topic, partition = "t", rng.randrange(4)
    uuids = _random_log(rng, topic, partition, steps=rng.randint(30, 150), producers=rng.randint(1, 4))
    base = rng.choice([0, 7, 1000])
    table = _table(uuids, partition, base, rng, chunk=100_000)
    raw = table.drop_columns(["uuid"])
    horizon = rng.choice([0, 1, 10**18])
    cut = rng.randrange(table.num_rows)
    for ring in (4, 8192):
        for policy in ("deliver", "drop"):
            head_plan = GroupPlan(topic=topic, start={partition: base}, states={}, uuid_policy=policy, ring_size=ring)
            _, head_states = _reference_sequence_partition(table.slice(0, cut), head_plan, 0) if cut else (None, [])
            whole = GroupPlan(
                topic=topic,
                start={partition: base + cut},
                states={(partition, st.producer): st for st in head_states},
                uuid_policy=policy,
                ring_size=ring,
            )
            expected, result = sequence_partition(table, whole, horizon)
            expected = expected.select(SEQUENCED.fieldNames())
            for chunk in (1, 5, 17, 1_000_000):
                plan = SplitPlan(topic, policy, False, ring, horizon, chunk_records=chunk)
                seq = SplitSequencer(plan, partition, base + cut, list(head_states))
                out = list(seq.run(raw.to_batches(max_chunksize=plan.read_batch)))
                # Each chunk's rows leave in log order; a row committed in a later chunk (its span
                # carried) may lie before rows an earlier chunk emitted: compare in log order.
                got = pa.concat_tables(out).sort_by("offset") if out else expected.slice(0, 0)
                assert got.combine_chunks().equals(expected.combine_chunks()), (seed, ring, policy, chunk)
                assert seq.end_states == result.states, (seed, ring, policy, chunk)
                assert seq.records == table.num_rows


def test_nothing_read_keeps_the_starting_states() -> None:
    from harvest_outbox.sequencer import ProducerState

    states = [ProducerState("t/0", b"\x01" * 6, 5, -1)]
    seq = SplitSequencer(SplitPlan("t", "deliver", False, 8, 0), 0, 10, states)
    assert list(seq.run([])) == [] and seq.end_states == states and seq.records == 0


def test_chunk_records_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_records=0"):
        SplitSequencer(SplitPlan("t", "deliver", False, 8, 0, chunk_records=0), 0, 0, [])


@pytest.mark.parametrize("seed", range(4))
def test_pushed_batches_equal_pulled(seed) -> None:
    """feed() each batch then finish() (a task reading several partitions with one consumer) gives
    the rows and end states of run() over the same batches."""
    rng = random.Random(100 + seed)
    topic, partition = "t", 0
    uuids = _random_log(rng, topic, partition, steps=rng.randint(30, 150), producers=rng.randint(1, 4))
    raw = _table(uuids, partition, 0, rng, chunk=100_000).drop_columns(["uuid"])
    for chunk in (1, 9, 1_000_000):
        plan = SplitPlan(topic, "deliver", False, 8, 0, chunk_records=chunk)
        batches = raw.to_batches(max_chunksize=rng.choice([1, 4, 50]))
        pulled = SplitSequencer(plan, partition, None, [])
        expected = list(pulled.run(batches))
        pushed = SplitSequencer(plan, partition, None, [])
        got = [t for b in batches for t in pushed.feed(b)] + list(pushed.finish())
        assert [t.num_rows for t in got] == [t.num_rows for t in expected], (seed, chunk)
        assert all(a.equals(b) for a, b in zip(got, expected, strict=True)), (seed, chunk)
        assert pushed.end_states == pulled.end_states and pushed.records == pulled.records == raw.num_rows
