"""A starting checkpoint of another reader is refused before Spark reads anything.

``read_committed`` (and ``readCommittedStream``, through the same ``spark_reader.offsets.resolve``)
checks the checkpoint's journals against the topic's partitions on the real broker: one that covers
none of them, or partitions the topic lacks, would otherwise start every partition from the log start
(re-delivering what the checkpoint's reader already delivered). No SparkSession is needed: the check
runs first.
"""

from __future__ import annotations

import logging

import pytest

from harvest_outbox.sequencer import ProducerState, encode_checkpoint, new_producer_id
from harvest_outbox.spark_reader import ReaderConfigError, read_committed
from harvest_outbox.spark_reader.offsets import resolve

pytestmark = pytest.mark.integration


def _opts(bootstrap: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap}


@pytest.mark.parametrize(
    ("journals", "needle"),
    [
        (["<other>/0", "<other>/1"], "none of which this reader reads (it reads topic '<topic>' partition(s) 0, 1)"),
        (["<topic>/0", "<topic>/5"], "covers <topic>/5, which this reader's topic does not have"),
        (["<topic>x/0"], "none of which this reader reads"),  # a prefix of the name is not the topic
    ],
)
def test_starting_checkpoint_of_another_reader_is_refused(
    kafka_bootstrap: str, topic_factory, journals: list[str], needle: str
) -> None:
    topic, other = topic_factory(partitions=2), topic_factory(partitions=2)
    names = {"<topic>": topic, "<other>": other}

    def named(text: str) -> str:
        for placeholder, name in names.items():
            text = text.replace(placeholder, name)
        return text

    cp = encode_checkpoint(
        {named(j): 3 for j in journals}, [ProducerState(named(journals[0]), new_producer_id(), 160, -1)]
    )
    with pytest.raises(ReaderConfigError) as info:
        read_committed(None, topic, _opts(kafka_bootstrap), starting=cp)  # type: ignore[arg-type]
    assert named(needle) in str(info.value) and str(info.value).startswith("starting: ")


def test_foreign_entries_are_carried_and_uncovered_partitions_named(
    kafka_bootstrap: str, topic_factory, caplog
) -> None:
    topic, other = topic_factory(partitions=2), topic_factory()
    cp = encode_checkpoint({f"{topic}/0": 0, f"{other}/0": 7}, [])
    caplog.set_level(logging.WARNING, logger="harvest_outbox.spark_reader")
    rng = resolve(topic, _opts(kafka_bootstrap), cp, "latest")
    assert rng.foreign_offsets == {f"{other}/0": 7} and rng.start == {0: 0, 1: 0}
    assert any(f"covers no offset for {topic}/1: read from the log start" in r.getMessage() for r in caplog.records)
