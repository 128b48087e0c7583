"""Extra options for every JVM harvest_local starts: the Kafka nodes (and their tools), the schema registry,
Debezium's worker, and Spark's driver and executors.

``HARVEST_JVM_OPTS`` holds them, split as a shell would; unset, the JVMs run with their own defaults. The
test suite sets ``-XX:TieredStopAtLevel=1`` (tests/conftest.py): the JIT's first tier only, which starts a
JVM with about half the CPU and does a test's short work as fast, where two cores run two workers' brokers,
Spark sessions and relays at once. Benchmarks and the demo leave it unset, so their JVMs run fully optimised.
A Kafka node applies them after its own options, so a ``-D`` given here wins (bench/broker_view.py adds the
broker's request log that way).
"""

from __future__ import annotations

import os
import shlex

VARIABLE = "HARVEST_JVM_OPTS"


def extra_options() -> list[str]:
    """The options of :data:`VARIABLE`, in order ([] when unset or blank)."""
    return shlex.split(os.environ.get(VARIABLE, ""))
