"""The at-least-once mode: goharvest's per-record purge."""


def fast_path() -> str:
    """``native`` when the per-record path (``_native.pyx``) runs, ``python`` when the reference does (not built, or
    ``HARVEST_PURE_PYTHON=1``): what ``harvest --version`` reports."""
    from harvest_outbox.producer.relay.at_least_once import _records

    return "native" if _records._native is not None else "python"
