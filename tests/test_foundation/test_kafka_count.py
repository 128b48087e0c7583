"""harvest_local.kafka.count_records on topics that are still being created (a Connect worker
creates its topics on the first record, while a test already waits for records in them)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from harvest_outbox.harvest_local.kafka import count_records

pytestmark = pytest.mark.integration


def test_a_topic_whose_leader_is_not_ready_yet_counts_as_empty(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """Right after CreateTopics the metadata may list a partition whose leader does not answer for
    it yet (NOT_LEADER_FOR_PARTITION): that is "no records yet", not an error. The window is short,
    so the test opens it on many topics, reading each until its partitions are listed."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [unique_name(f"count{i}") for i in range(150)]
    try:
        for name in names:
            admin.create_topics([NewTopic(name, 4, 1)])
            for _ in range(50):
                assert count_records(kafka_bootstrap, [name], timeout=5) == 0
                topic = admin.list_topics(name, timeout=5).topics[name]
                if topic.error is None and len(topic.partitions) == 4:
                    break
    finally:
        admin.delete_topics(names)
