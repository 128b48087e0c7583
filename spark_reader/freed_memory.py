"""Handing the memory a Spark task has freed back to the OS, after each chunk it sequenced.

A batch task frees each chunk's records (Python objects, Arrow buffers, librdkafka's fetched
messages) before it reads the next, but the allocators keep what was freed for later: pyarrow's
mimalloc its pages, glibc its arenas' free chunks. And each partition a task reads brings a new
consumer, whose librdkafka threads allocate their fetch buffers in glibc arenas of their own
(glibc gives threads up to 8 arenas per core). So a process reading partitions of 1.25M records
grew partition after partition (521 MB after the first, 692 MB after the fourth) up to a plateau
set by the allocators' caches, not by the chunk (709 MB from the fifth on). :func:`release` after
each chunk hands the freed pages back: the same read then peaks at one chunk's working set (468 MB
with the default 250,000-record chunk, reached in the first partition) and sits at 280-380 MB
between partitions, whatever their number (docs/reading-spark.md, "Memory").

:func:`release` calls ``release_unused()`` on Arrow's default memory pool (for mimalloc a forced
collection) and glibc's ``malloc_trim(0)`` (each arena's free pages are given back, not only its
top), a few milliseconds per call against the ~0.3 s a chunk of 250,000 records takes to read.

Invariants:
- nothing alive is freed or moved: both calls only return pages that hold no allocation;
- where the C library has no ``malloc_trim`` (musl, macOS) only Arrow's pool is asked;
- ``HARVEST_SPARK_RELEASE_FREED=0`` in a task's environment turns it off (to measure the
  difference, e.g. through ``spark.executorEnv``); any other value but ``1`` is refused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable

import pyarrow as pa

from harvest_outbox.spark_reader.errors import ReaderConfigError

ENV = "HARVEST_SPARK_RELEASE_FREED"


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def enabled() -> bool:
    """Whether :func:`release` does anything in this process (:data:`ENV`, default on)."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise ReaderConfigError(
            f"{ENV}={value!r}: set it to 1 (hand freed memory back to the OS after each chunk, the default) or 0 "
            "(leave it to the allocators)"
        )
    return value == "1"


def release() -> float:
    """Hand the pages freed so far back to the OS (unless turned off); the seconds it took."""
    if not enabled():
        return 0.0
    t = time.perf_counter()
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    return time.perf_counter() - t
