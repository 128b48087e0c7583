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

``__version__`` is defined here and only here (``harvest_outbox.producer.__version__`` is this one;
``tests/test_foundation/test_owners.py`` keeps it so). It is read from the installed metadata on
first use (PEP 562): that costs ~10-20 ms, which ``import harvest_outbox.<package>`` should not pay.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UNKNOWN_VERSION", "__version__"]

#: ``__version__`` of a checkout that is not installed (no distribution metadata to read).
UNKNOWN_VERSION = "0+unknown"


def __getattr__(name: str) -> Any:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("harvest-outbox")
    except PackageNotFoundError:  # run from a checkout that is not installed
        value = UNKNOWN_VERSION
    globals()[name] = value
    return value
