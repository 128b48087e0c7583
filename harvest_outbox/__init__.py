"""harvest: a transactional-outbox relay (Postgres -> Kafka) with exactly-once sequencing.

The installed import package of the ``harvest-outbox`` distribution. Its subpackages:

* :mod:`harvest_outbox.producer`: the stasher (``Stasher``, ``AsyncStasher``, the SQLAlchemy
  binding) and the relay (``Harvest``, the ``harvest`` command).
* :mod:`harvest_outbox.sequencer`: Gazette's read-committed state machine (``Sequencer``).
* :mod:`harvest_outbox.consumer`: read-committed Kafka readers (``ReadCommittedIter``).
* :mod:`harvest_outbox.spark_reader`: the same for PySpark (``read_committed``).
* :mod:`harvest_outbox.harvest_local`: embedded Postgres/Kafka/Spark for demos and tests.

Invariant: every module of the project is imported as ``harvest_outbox.<package>...``; nothing
else is installed at the top level of site-packages. In the source repository the subpackages are
the top-level folders (``producer/``...), mapped by pyproject.toml's ``package-dir``. This module
imports nothing, so ``import harvest_outbox.sequencer`` does not pull in Kafka or Spark.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("harvest-outbox")
except PackageNotFoundError:  # run from a checkout that is not installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
